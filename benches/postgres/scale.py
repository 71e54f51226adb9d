"""Many `agent-kernel bench` processes on one log: P processes, each running --sagas plan
sagas of --steps steps at --concurrency sagas at once, started together on one PostgreSQL
schema (`bench --db URL`); beside them one process on a temporary SQLite log at the same
concurrency. Steps/s is all processes' steps over the longest process's run (each process's
own `elapsed_ms`: opening the log is not counted). Transactions and round trips per step are
summed over the processes. With --server-cpu, the CPU the server's processes took (those of
the user running it on this machine, exited backends included through their parent's
counts, autovacuum too) per step. Each round measures every case once, alternating the
order; the median of the rounds is printed."""

import argparse
import glob
import json
import os
import pwd
import statistics
import subprocess
import uuid


def psql(url, sql):
    subprocess.run(["psql", url, "-q", "-v", "ON_ERROR_STOP=1", "-c", sql], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def forget_head_files(url, schema):
    """Removes the head files the processes kept on this machine for the log in `schema`
    (`$XDG_STATE_HOME/agent-kernel/*.log-LOG_ID.audit-head`), which is about to be dropped:
    they would otherwise stay behind, one for each schema a run made."""
    found = subprocess.run(["psql", url, "-qtA", "-c", f"SELECT log_id FROM {schema}.agent_kernel_meta"],
                           capture_output=True, text=True)
    log_id = found.stdout.strip()
    if found.returncode != 0 or not log_id:
        return
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    for path in glob.glob(os.path.join(state, "agent-kernel", f"*.log-{glob.escape(log_id)}.audit-head")):
        os.remove(path)


def server_cpu_seconds(user):
    """CPU time, user and system, of every process of `user` and of its children that
    exited: fields 14 to 17 of /proc/PID/stat."""
    uid = pwd.getpwnam(user).pw_uid
    ticks = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid:
                continue
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # After the command's closing parenthesis, field 3 is the first: 14 to 17 are
        # utime, stime, cutime, cstime.
        ticks += sum(int(value) for value in fields[11:15])
    return ticks / os.sysconf("SC_CLK_TCK")


def bench(binary, db, processes, args, concurrency, env):
    command = [binary]
    if db:
        command += ["--db", db]
    command += ["--json", "bench", "--sagas", str(args.sagas), "--steps", str(args.steps),
                "--concurrency", str(concurrency), "--durability", args.durability,
                "--locks", args.locks]
    running = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
               for _ in range(processes)]
    reports = []
    for process in running:
        stdout, stderr = process.communicate()
        if process.returncode != 0:
            raise SystemExit(f"bench exited {process.returncode}: {stderr.decode()[-800:]}")
        reports.append(json.loads(stdout))
    steps = sum(report["n_steps"] for report in reports)
    elapsed = max(report["elapsed_ms"] for report in reports) / 1e3
    transactions = sum(report["n_transactions"] for report in reports) / steps
    trips = [report.get("round_trips_per_step") for report in reports]
    trips = None if None in trips else sum(t * r["n_steps"] for t, r in zip(trips, reports)) / steps
    return steps / elapsed, transactions, trips, steps


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", required=True)
    parser.add_argument("--url", required=True)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--sagas", type=int, default=100)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--durability", default="full", choices=["full", "normal"])
    parser.add_argument("--processes", default="1,2,4,8")
    parser.add_argument("--concurrency", default="1,64")
    parser.add_argument("--locks", default="on", choices=["on", "off"],
                        help="whether each step claims a resource of its own (bench --locks)")
    parser.add_argument("--server-cpu", metavar="USER",
                        help="report the CPU per step of the processes USER runs (the server's)")
    args = parser.parse_args()
    binary = os.path.abspath(args.bin)
    env = {key: value for key, value in os.environ.items() if not key.startswith("AGENT_KERNEL_")}
    processes = [int(n) for n in args.processes.split(",")]
    concurrencies = [int(n) for n in args.concurrency.split(",")]
    cases = [(c, "sqlite", 1) for c in concurrencies]
    cases += [(c, "postgres", p) for c in concurrencies for p in processes]
    results = {}
    for round_no in range(args.rounds):
        order = cases if round_no % 2 == 0 else list(reversed(cases))
        for concurrency, backend, count in order:
            db = None
            if backend == "postgres":
                schema = "bench_" + uuid.uuid4().hex[:12]
                psql(args.url, f"CREATE SCHEMA {schema}")
                separator = "&" if "?" in args.url else "?"
                db = f"{args.url}{separator}options=-c%20search_path%3D{schema}"
            try:
                before = server_cpu_seconds(args.server_cpu) if args.server_cpu and db else None
                rate, transactions, trips, steps = bench(binary, db, count, args, concurrency, env)
                server = None
                if before is not None:
                    server = (server_cpu_seconds(args.server_cpu) - before) / steps * 1e6
                measured = (rate, transactions, trips, server)
            finally:
                if db:
                    forget_head_files(args.url, schema)
                    psql(args.url, f"DROP SCHEMA {schema} CASCADE")
            results.setdefault((concurrency, backend, count), []).append(measured)
    print(f"durability {args.durability}; each process {args.sagas} plan sagas x {args.steps} steps; "
          f"median of {args.rounds} rounds")
    print("| concurrency per process | log | processes | steps/s together | transactions per step | round trips per step | server CPU per step (µs) |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for concurrency, backend, count in cases:
        runs = results[(concurrency, backend, count)]
        rate = statistics.median(run[0] for run in runs)
        transactions = statistics.median(run[1] for run in runs)
        trips = None if runs[0][2] is None else statistics.median(run[2] for run in runs)
        trips_text = "" if trips is None else f"{trips:.2f}"
        server = None if runs[0][3] is None else statistics.median(run[3] for run in runs)
        server_text = "" if server is None else f"{server:.0f}"
        name = "SQLite (temporary)" if backend == "sqlite" else "PostgreSQL (shared)"
        print(f"| {concurrency} | {name} | {count} | {rate:,.0f} | {transactions:.3f} | {trips_text} | {server_text} |")


if __name__ == "__main__":
    main()
