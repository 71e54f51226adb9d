#!/usr/bin/env python3
"""Calls per second and latency per call through `agent-kernel mcp`, with the standard
library only: raw JSON-RPC lines over the server's stdin and stdout.

    python3 benches/mcp_bench.py [--bin target/release/agent-kernel ...] [--calls 2000]
        [--sagas 200] [--durability full|normal] [--tool noop|fs_write] [--rounds 1]
        [--syncs]

Measures, in a temporary folder with a fresh log, for each binary given (alternating, round
after round, so that binaries are compared within the same minutes):
- autocommit: calls of `--tool` without a saga id, each a saga of its own;
- sagas of 10 calls: saga_begin, 10 calls, saga_commit, timed per call and per saga.
Latency is what the client sees, from writing the request to reading its answer.
Also printed: the disk's floor, the median time of a 4 KiB write and `fdatasync` in the same
folder; the direct call, the median of an MCP `ping` to the same server over the same pipes
(the JSON-RPC round trip any stdio server costs); and, for autocommit calls at `full`,
`beyond_syncs_us`: the p50 less the direct call and two floors (an autocommit call's two
synced commits). With `--syncs` (needs `strace`), the `fsync` and `fdatasync` calls the
server makes per autocommit call.
"""

import argparse
import json
import os
import statistics
import tempfile
import time

from mcp_lines import LineSession, percentile

SYNC_FLOOR_SAMPLES = 200
PING_SAMPLES = 500


class Server(LineSession):
    def __init__(self, command, folder):
        with open(os.path.join(folder, "sandbox.toml"), "w") as policy:
            policy.write('[fs]\nallow = ["ws"]\n')
        os.makedirs(os.path.join(folder, "ws"), exist_ok=True)
        super().__init__(command, folder)

    def call(self, name, arguments):
        answer = self.request("tools/call", {"name": name, "arguments": arguments})
        result = answer["result"]
        assert not result.get("isError"), result
        return result["structuredContent"]


def report(label, latencies_s, elapsed_s, n_calls, **more):
    micros = [sample * 1e6 for sample in latencies_s]
    print(json.dumps({
        "run": label,
        "calls": n_calls,
        "calls_per_sec": round(n_calls / elapsed_s),
        "p50_us": round(statistics.median(micros)),
        "p99_us": round(percentile(micros, 0.99)),
        **more,
    }), flush=True)


def sync_floor_us(folder):
    """The median of a 4 KiB write followed by fdatasync, in `folder`."""
    path = os.path.join(folder, "floor")
    samples = []
    with open(path, "wb") as file:
        for _ in range(SYNC_FLOOR_SAMPLES):
            before = time.perf_counter()
            file.write(b"x" * 4096)
            file.flush()
            os.fdatasync(file.fileno())
            samples.append((time.perf_counter() - before) * 1e6)
    os.remove(path)
    return round(statistics.median(samples))


def direct_call_us(server):
    """The median of an MCP `ping` to `server`: the stdio round trip, with no tool and no log."""
    samples = []
    for _ in range(PING_SAMPLES):
        before = time.perf_counter()
        assert "result" in server.request("ping", {})
        samples.append((time.perf_counter() - before) * 1e6)
    return round(statistics.median(samples))


def arguments_of(tool, n):
    if tool == "fs_write":
        return {"path": f"ws/f{n % 100}.txt", "content": "x"}
    return {}


def autocommit(binary, options, label, strace=False):
    with tempfile.TemporaryDirectory() as folder:
        command = [binary, "--db", os.path.join(folder, "bench.db"), "-q", "mcp", "--durability", options.durability]
        counted = os.path.join(folder, "strace.txt")
        if strace:
            command = ["strace", "-f", "-c", "-o", counted, "-e", "trace=fsync,fdatasync"] + command
        server = Server(command, folder)
        floor = sync_floor_us(folder)
        # Warm up: the first calls open files and fill caches.
        for n in range(20):
            server.call(options.tool, {"args": arguments_of(options.tool, n)})
        latencies = []
        started = time.perf_counter()
        for n in range(options.calls):
            before = time.perf_counter()
            content = server.call(options.tool, {"args": arguments_of(options.tool, n)})
            latencies.append(time.perf_counter() - before)
            assert content["state"] == "Done", content
        elapsed = time.perf_counter() - started
        direct = direct_call_us(server)
        server.close()
        if strace:
            syncs = 0
            for line in open(counted):
                fields = line.split()
                if fields and fields[-1] in ("fsync", "fdatasync"):
                    syncs += int(fields[3])
            print(json.dumps({"binary": label, "tool": options.tool, "durability": options.durability,
                              "syncs_per_call": round(syncs / (options.calls + 20), 2)}), flush=True)
            return
        p50_us = round(statistics.median(latencies) * 1e6)
        beyond = {"beyond_syncs_us": p50_us - direct - 2 * floor} if options.durability == "full" else {}
        report(f"{label}: autocommit {options.tool}", latencies, elapsed, options.calls,
               durability=options.durability, sync_floor_us=floor, direct_call_us=direct, **beyond)


def sagas(binary, options, label):
    with tempfile.TemporaryDirectory() as folder:
        server = Server([binary, "--db", os.path.join(folder, "bench.db"), "-q", "mcp", "--durability", options.durability], folder)
        latencies = []
        n_calls = 0
        started = time.perf_counter()
        for _ in range(options.sagas):
            before = time.perf_counter()
            saga = server.call("saga_begin", {})["saga_id"]
            latencies.append(time.perf_counter() - before)
            for n in range(10):
                before = time.perf_counter()
                server.call(options.tool, {"saga_id": saga, "args": arguments_of(options.tool, n)})
                latencies.append(time.perf_counter() - before)
            before = time.perf_counter()
            assert server.call("saga_commit", {"saga_id": saga})["state"] == "Done"
            latencies.append(time.perf_counter() - before)
            n_calls += 12
        elapsed = time.perf_counter() - started
        server.close()
        report(f"{label}: 10-call sagas (12 calls each: begin, 10 {options.tool}, commit)", latencies, elapsed,
               n_calls, durability=options.durability, sagas_per_sec=round(options.sagas / elapsed))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", nargs="+", default=["target/release/agent-kernel"])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--sagas", type=int, default=200)
    parser.add_argument("--durability", choices=["full", "normal"], default="full")
    parser.add_argument("--tool", choices=["noop", "fs_write"], default="noop")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--syncs", action="store_true", help="count the server's syncs per autocommit call with strace")
    options = parser.parse_args()
    binaries = [os.path.abspath(path) for path in options.bin]
    for round_idx in range(options.rounds):
        for binary in binaries:
            label = f"round {round_idx + 1} {binary}"
            if options.syncs:
                autocommit(binary, options, label, strace=True)
                continue
            autocommit(binary, options, label)
            if options.sagas:
                sagas(binary, options, label)


if __name__ == "__main__":
    main()
