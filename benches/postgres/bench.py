"""Workers sharing one log: W processes, each running one plan of --steps `noop` steps
through `agent-kernel run`, started together; steps/s is W * steps over the wall time from
the first start to the last exit (process start-up and the log's opening included). Each
round measures every (backend, W) once, in alternating order; the median is printed."""

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time


def run_workers(binary, db, plan, workers, durability, env):
    started = time.perf_counter()
    processes = [
        subprocess.Popen(
            [binary, "--db", db, "--json", "run", "--plan", plan, "--durability", durability],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
        )
        for _ in range(workers)
    ]
    for process in processes:
        _, stderr = process.communicate()
        if process.returncode != 0:
            raise SystemExit(f"a worker exited {process.returncode}: {stderr.decode()[-500:]}")
    return time.perf_counter() - started


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", required=True)
    parser.add_argument("--url", required=True)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--durability", default="full", choices=["full", "normal"])
    args = parser.parse_args()
    binary = os.path.abspath(args.bin)
    env = {key: value for key, value in os.environ.items() if not key.startswith("AGENT_KERNEL_")}
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        plan = os.path.join(folder, "plan.json")
        with open(plan, "w") as out:
            json.dump({"name": "bench", "steps": [{"tool": "noop", "args": {}}] * args.steps}, out)
        cases = [(backend, workers) for workers in (1, 2, 4) for backend in ("sqlite", "postgres")]
        for round_no in range(args.rounds):
            order = cases if round_no % 2 == 0 else list(reversed(cases))
            for backend, workers in order:
                db = args.url if backend == "postgres" else os.path.join(folder, f"r{round_no}-{workers}.db")
                elapsed = run_workers(binary, db, plan, workers, args.durability, env)
                results.setdefault((backend, workers), []).append(workers * args.steps / elapsed)
    print(f"| workers | SQLite steps/s | PostgreSQL steps/s |  (durability {args.durability}, {args.steps} steps per worker, median of {args.rounds} rounds)")
    print("| ---: | ---: | ---: |")
    for workers in (1, 2, 4):
        sqlite = statistics.median(results[("sqlite", workers)])
        postgres = statistics.median(results[("postgres", workers)])
        print(f"| {workers} | {sqlite:,.0f} | {postgres:,.0f} |")


if __name__ == "__main__":
    main()
