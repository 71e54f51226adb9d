"""agent-kernel beside its peers on the same work: workflows of 10 no-op steps, durable in
SQLite, one at a time and 64 in flight.

- agent-kernel: `agent-kernel bench --steps 10` (plans and live sagas), durability `full`.
- DBOS (Python, SQLite system database): a `@DBOS.workflow` calling 10 `@DBOS.step`s.
- LangGraph (`SqliteSaver`): a graph of 10 chained nodes, a checkpoint per super-step.

Every system runs in a fresh process of its own, in a fresh temporary folder, and the
rounds alternate between systems in the same minutes, so drift hits them alike. Startup
(imports, migrations, launch) is not timed: only the workflows are.

    benches/peers/run.sh [--rounds 3] [--workflows 200]

prints a Markdown table and writes every measurement as JSON (`--json PATH`).
"""

import argparse
import datetime
import json
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

STEPS = 10


def run_dbos(folder, workflows, concurrency):
    from dbos import DBOS

    db = os.path.join(folder, "dbos.sqlite")
    DBOS(config={"name": "peers", "system_database_url": f"sqlite:///{db}"})

    @DBOS.step()
    def noop(i):
        return i

    @DBOS.workflow()
    def workflow():
        for i in range(STEPS):
            noop(i)
        return STEPS

    DBOS.launch()
    workflow()  # warm: the first workflow pays for lazy set-up
    started = time.perf_counter()
    if concurrency == 1:
        for _ in range(workflows):
            assert workflow() == STEPS
    else:
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            results = list(pool.map(lambda _: workflow(), range(workflows)))
        assert results == [STEPS] * workflows
    elapsed = time.perf_counter() - started
    conn = sqlite3.connect(db)
    pragmas = {
        "journal_mode": conn.execute("PRAGMA journal_mode").fetchone()[0],
        # DBOS sets no synchronous level: SQLite's default, FULL (2).
        "synchronous": conn.execute("PRAGMA synchronous").fetchone()[0],
    }
    conn.close()
    DBOS.destroy()
    return elapsed, pragmas


def run_langgraph(folder, workflows, concurrency):
    from typing import TypedDict

    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.graph import END, START, StateGraph

    class State(TypedDict):
        n: int

    def noop(state):
        return {"n": state["n"] + 1}

    builder = StateGraph(State)
    for i in range(STEPS):
        builder.add_node(f"step{i}", noop)
        builder.add_edge(START if i == 0 else f"step{i - 1}", f"step{i}")
    builder.add_edge(f"step{STEPS - 1}", END)
    conn = sqlite3.connect(os.path.join(folder, "checkpoints.sqlite"), check_same_thread=False)
    graph = builder.compile(checkpointer=SqliteSaver(conn))

    def workflow(k):
        return graph.invoke({"n": 0}, {"configurable": {"thread_id": f"t{k}"}})["n"]

    workflow("warm")
    started = time.perf_counter()
    if concurrency == 1:
        for k in range(workflows):
            assert workflow(k) == STEPS
    else:
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            results = list(pool.map(workflow, range(workflows)))
        assert results == [STEPS] * workflows
    elapsed = time.perf_counter() - started
    pragmas = {
        "journal_mode": conn.execute("PRAGMA journal_mode").fetchone()[0],
        "synchronous": conn.execute("PRAGMA synchronous").fetchone()[0],
    }
    conn.close()
    return elapsed, pragmas


def one(system, workflows, concurrency):
    """Runs one measurement in this process and prints it as one JSON line."""
    with tempfile.TemporaryDirectory() as folder:
        runner = {"dbos": run_dbos, "langgraph": run_langgraph}[system]
        elapsed, pragmas = runner(folder, workflows, concurrency)
    print(json.dumps({
        "system": system,
        "concurrency": concurrency,
        "workflows": workflows,
        "steps": workflows * STEPS,
        "elapsed_s": elapsed,
        "steps_per_sec": workflows * STEPS / elapsed,
        "sqlite": pragmas,
    }))


def measure(kernel, system, workflows, concurrency):
    if system.startswith("agent-kernel"):
        command = [kernel, "bench", "--json", "--sagas", str(workflows), "--steps", str(STEPS),
                   "--concurrency", str(concurrency), "--durability", "full"]
        if system == "agent-kernel (live)":
            command.append("--live")
        report = json.loads(subprocess.run(command, check=True, capture_output=True,
                                           text=True).stdout)
        return {"system": system, "concurrency": concurrency, "workflows": workflows,
                "steps": report["n_steps"], "elapsed_s": report["elapsed_ms"] / 1e3,
                "steps_per_sec": report["steps_per_sec"], "p99_us": report["p99_us"],
                "sqlite": {"journal_mode": "wal", "synchronous": 2}}
    out = subprocess.run([sys.executable, __file__, "--one", system, "--workflows",
                          str(workflows), "--concurrency", str(concurrency)],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", default="target/release/agent-kernel")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workflows", type=int, default=200)
    parser.add_argument("--json", dest="json_path")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--concurrency", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        one(args.one, args.workflows, args.concurrency)
        return
    systems = ["agent-kernel (plan)", "agent-kernel (live)", "dbos", "langgraph"]
    results = []
    for round_idx in range(args.rounds):
        for concurrency in (1, 64):
            for system in systems:
                result = measure(args.kernel, system, args.workflows, concurrency)
                result["round"] = round_idx
                results.append(result)
                print(f"round {round_idx} concurrency {concurrency:>2} {system:<20} "
                      f"{result['steps_per_sec']:>9.0f} steps/s", file=sys.stderr)
    document = {
        "date": datetime.date.today().isoformat(),
        "command": " ".join(["benches/peers/run.sh"] + sys.argv[1:]),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "results": results,
    }
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(document, f, indent=2)
    print(f"| system | concurrency | steps/s (median of {args.rounds}) | range | SQLite |")
    print("| --- | --- | --- | --- | --- |")
    for concurrency in (1, 64):
        for system in systems:
            rates = [r["steps_per_sec"] for r in results
                     if r["system"] == system and r["concurrency"] == concurrency]
            sqlite = next(r["sqlite"] for r in results if r["system"] == system)
            print(f"| {system} | {concurrency} | {statistics.median(rates):,.0f} | "
                  f"{min(rates):,.0f} – {max(rates):,.0f} | "
                  f"{sqlite['journal_mode']}, synchronous {sqlite['synchronous']} |")


if __name__ == "__main__":
    main()
