"""The LangGraph adapter with a real LangGraph graph and a scripted chat model (no network)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool as lc_tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import interrupt
from langgraph.prebuilt import ToolNode, tools_condition

import asyncio

from agent_kernel import StepFailed
from agent_kernel.langgraph import KernelToolCalls, transactional


class ScriptedModel(FakeMessagesListChatModel):
    """A chat model that answers from a script and accepts tools, as a real one does."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedModel:
        return self


def call(name: str, args: dict, id: str) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": id}])


def note_tools(notes: Path):
    """A LangChain tool that adds a note to `notes`, and its compensation."""
    notes.write_text("{}")

    @lc_tool
    def add_note(key: str, text: str) -> str:
        """Adds a note."""
        data = json.loads(notes.read_text())
        data[key] = text
        notes.write_text(json.dumps(data))
        return f"added {key}"

    def remove_note(args: dict, output: Any) -> None:
        data = json.loads(notes.read_text())
        data.pop(args["key"], None)
        notes.write_text(json.dumps(data))

    return add_note, remove_note


def build(project: Path, make_kernel, script: list[AIMessage], per: str = "run"):
    notes = project / "ws" / "notes.json"
    add_note, remove_note = note_tools(notes)

    @lc_tool
    def publish(key: str) -> str:
        """Publishes a note."""
        raise RuntimeError(f"the publishing service refused {key}")

    tools = [add_note, publish]
    kernel = make_kernel(
        transactional(add_note, compensate=remove_note),
        transactional(publish, compensate=lambda args, output: None),
    )
    calls = KernelToolCalls(kernel, per=per)
    model = ScriptedModel(responses=script)

    def agent(state: MessagesState) -> dict:
        return {"messages": [model.bind_tools(tools).invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode(tools, wrap_tool_call=calls.wrap, awrap_tool_call=calls.awrap))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile(), calls, kernel, notes


def test_a_run_whose_third_tool_call_fails_leaves_no_effect_of_the_first_two(project: Path, make_kernel):
    script = [
        call("add_note", {"key": "a", "text": "alpha"}, "c1"),
        call("add_note", {"key": "b", "text": "beta"}, "c2"),
        call("publish", {"key": "a"}, "c3"),
        AIMessage(content="done"),
    ]
    graph, calls, kernel, notes = build(project, make_kernel, script)
    with pytest.raises(StepFailed, match="refused a") as raised:
        calls.invoke(graph, {"messages": [HumanMessage("write two notes and publish")]})
    assert json.loads(notes.read_text()) == {}
    record = kernel.saga_record(raised.value.saga_id)
    assert record["state"] == "FailedRolledBack"
    assert [step["tool_id"] for step in record["steps"]] == ["add_note", "add_note", "publish"]


def test_a_run_that_ends_well_commits_and_its_messages_carry_the_saga_id(project: Path, make_kernel):
    script = [
        call("add_note", {"key": "a", "text": "alpha"}, "c1"),
        call("add_note", {"key": "b", "text": "beta"}, "c2"),
        AIMessage(content="done"),
    ]
    graph, calls, kernel, notes = build(project, make_kernel, script)
    result = calls.invoke(graph, {"messages": [HumanMessage("write two notes")]})
    assert json.loads(notes.read_text()) == {"a": "alpha", "b": "beta"}
    tool_messages = [m for m in result["messages"] if isinstance(m, ToolMessage)]
    saga_ids = {m.artifact["agent_kernel_saga_id"] for m in tool_messages}
    assert len(saga_ids) == 1
    assert kernel.saga_record(saga_ids.pop())["state"] == "Done"


def test_per_thread_sagas_span_runs_until_committed(project: Path, make_kernel):
    script = [
        call("add_note", {"key": "a", "text": "alpha"}, "c1"),
        AIMessage(content="one"),
        call("add_note", {"key": "b", "text": "beta"}, "c2"),
        AIMessage(content="two"),
    ]
    graph, calls, kernel, notes = build(project, make_kernel, script, per="thread")
    config = {"configurable": {"thread_id": "t1"}}
    calls.invoke(graph, {"messages": [HumanMessage("first")]}, config)
    calls.invoke(graph, {"messages": [HumanMessage("second")]}, config)
    assert json.loads(notes.read_text()) == {"a": "alpha", "b": "beta"}
    report = calls.commit_thread("t1")
    assert report["state"] == "Done"
    assert len(report["steps"]) == 2


def test_an_interrupted_run_is_rolled_back(project: Path, make_kernel):
    notes = project / "ws" / "notes.json"
    add_note, remove_note = note_tools(notes)
    kernel = make_kernel(transactional(add_note, compensate=remove_note))
    calls = KernelToolCalls(kernel)
    model = ScriptedModel(responses=[call("add_note", {"key": "a", "text": "alpha"}, "c1")])

    def agent(state: MessagesState) -> dict:
        return {"messages": [model.invoke(state["messages"])]}

    def review(state: MessagesState) -> dict:
        interrupt("a person must look at this first")
        return {}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode([add_note], wrap_tool_call=calls.wrap))
    graph.add_node("review", review)
    graph.add_edge(START, "agent")
    graph.add_edge("agent", "tools")
    graph.add_edge("tools", "review")
    graph.add_edge("review", END)
    compiled = graph.compile(checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "interrupted"}}
    result = calls.invoke(compiled, {"messages": [HumanMessage("note it")]}, config)
    assert result["__interrupt__"]
    assert json.loads(notes.read_text()) == {}
    saga_id = next(m for m in result["messages"] if isinstance(m, ToolMessage)).artifact["agent_kernel_saga_id"]
    assert kernel.saga_record(saga_id)["state"] == "FailedRolledBack"


def test_ainvoke_rolls_back_a_failing_run(project: Path, make_kernel):
    script = [
        call("add_note", {"key": "a", "text": "alpha"}, "c1"),
        call("publish", {"key": "a"}, "c2"),
        AIMessage(content="done"),
    ]
    graph, calls, kernel, notes = build(project, make_kernel, script)
    with pytest.raises(StepFailed):
        asyncio.run(calls.ainvoke(graph, {"messages": [HumanMessage("note and publish")]}))
    assert json.loads(notes.read_text()) == {}


def test_a_failing_run_rolls_back_its_threads_saga_and_a_new_run_starts_a_new_one(project: Path, make_kernel):
    script = [
        call("add_note", {"key": "a", "text": "alpha"}, "c1"),
        AIMessage(content="one"),
        call("publish", {"key": "a"}, "c2"),
        call("add_note", {"key": "b", "text": "beta"}, "c3"),
        AIMessage(content="three"),
    ]
    graph, calls, kernel, notes = build(project, make_kernel, script, per="thread")
    config = {"configurable": {"thread_id": "t2"}}
    calls.invoke(graph, {"messages": [HumanMessage("first")]}, config)
    assert json.loads(notes.read_text()) == {"a": "alpha"}
    with pytest.raises(StepFailed):
        calls.invoke(graph, {"messages": [HumanMessage("second")]}, config)
    # The failure rolled back the thread's saga, the first run's note included.
    assert json.loads(notes.read_text()) == {}
    calls.invoke(graph, {"messages": [HumanMessage("third")]}, config)
    assert calls.commit_thread("t2")["state"] == "Done"
    assert json.loads(notes.read_text()) == {"b": "beta"}
