"""A LangGraph agent whose tool calls are saga steps: when its third call fails, the first
two are undone.

    python3 -m venv .venv && .venv/bin/pip install './crates/agent-kernel-py[langgraph]'
    .venv/bin/python examples/python/langgraph_agent.py

The chat model is scripted (no network, no API key): it asks for two notes and then for a
publication that the publishing service refuses. Everything happens in a temporary folder.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from agent_kernel import Kernel, StepFailed
from agent_kernel.langgraph import KernelToolCalls, transactional


class ScriptedModel(FakeMessagesListChatModel):
    """Answers from a script, as a real model would with tools bound."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedModel:
        return self


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="agent-kernel-langgraph-") as name:
        run(Path(name))


def run(folder: Path) -> None:
    (folder / "workspace").mkdir()
    (folder / "sandbox.toml").write_text('[fs]\nallow = ["workspace"]\n')
    notes = folder / "workspace" / "notes.json"
    notes.write_text("{}")

    @tool
    def add_note(key: str, text: str) -> str:
        """Adds a note to the notebook."""
        data = json.loads(notes.read_text())
        data[key] = text
        notes.write_text(json.dumps(data))
        return f"added {key}"

    @tool
    def publish(key: str) -> str:
        """Publishes a note."""
        raise RuntimeError("the publishing service is down")

    def remove_note(args: dict, output: Any) -> None:
        data = json.loads(notes.read_text())
        data.pop(args["key"], None)
        notes.write_text(json.dumps(data))

    kernel = Kernel(
        db=folder / "agent-kernel.db",
        sandbox=folder / "sandbox.toml",
        cwd=folder,
        python_tools=[
            transactional(add_note, compensate=remove_note),
            transactional(publish, effect="read-only"),
        ],
    )
    calls = KernelToolCalls(kernel)
    tools = [add_note, publish]
    model = ScriptedModel(
        responses=[
            AIMessage("", tool_calls=[{"name": "add_note", "args": {"key": "a", "text": "alpha"}, "id": "1"}]),
            AIMessage("", tool_calls=[{"name": "add_note", "args": {"key": "b", "text": "beta"}, "id": "2"}]),
            AIMessage("", tool_calls=[{"name": "publish", "args": {"key": "a"}, "id": "3"}]),
            AIMessage("done"),
        ]
    )

    def agent(state: MessagesState) -> dict:
        return {"messages": [model.bind_tools(tools).invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode(tools, wrap_tool_call=calls.wrap))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")

    try:
        calls.invoke(graph.compile(), {"messages": [HumanMessage("write two notes, publish one")]})
    except StepFailed as failure:
        record = kernel.saga_record(failure.saga_id)
        print(f"the run failed: {failure}")
        print(f"saga {failure.saga_id}: {record['state']}")
        for step in record["steps"]:
            print(f"  step {step['step_seq']} {step['tool_id']}: {step['status']}")
    print(f"notes after the run: {notes.read_text()}")


if __name__ == "__main__":
    main()
