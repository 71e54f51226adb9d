#!/usr/bin/env python3
"""Calls per second and latency per call through `agent-kernel mcp`, with the standard
library only: raw JSON-RPC lines over the server's stdin and stdout.

    python3 benches/mcp_bench.py [--bin target/release/agent-kernel] [--calls 2000] [--sagas 200]

Measures, in a temporary folder with a fresh log (durability full, the default):
- autocommit: `noop` calls without a saga id, each a saga of its own (begin, step, commit);
- sagas of 10 calls: saga_begin, 10 `noop` calls, saga_commit, timed per call and per saga.
Latency is what the client sees, from writing the request to reading its answer.
"""

import argparse
import json
import os
import statistics
import tempfile
import time

from mcp_lines import LineSession, percentile


class Server(LineSession):
    def __init__(self, binary, folder):
        super().__init__([binary, "--db", os.path.join(folder, "bench.db"), "-q", "mcp"], folder)

    def call(self, name, arguments):
        answer = self.request("tools/call", {"name": name, "arguments": arguments})
        result = answer["result"]
        assert not result.get("isError"), result
        return result["structuredContent"]


def report(label, latencies_s, elapsed_s, n_calls):
    micros = [sample * 1e6 for sample in latencies_s]
    print(json.dumps({
        "run": label,
        "calls": n_calls,
        "calls_per_sec": round(n_calls / elapsed_s),
        "p50_us": round(statistics.median(micros)),
        "p99_us": round(percentile(micros, 0.99)),
    }))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", default="target/release/agent-kernel")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--sagas", type=int, default=200)
    options = parser.parse_args()
    binary = os.path.abspath(options.bin)
    with tempfile.TemporaryDirectory() as folder:
        server = Server(binary, folder)
        latencies = []
        started = time.perf_counter()
        for _ in range(options.calls):
            before = time.perf_counter()
            content = server.call("noop", {"args": {}})
            latencies.append(time.perf_counter() - before)
            assert content["state"] == "Done", content
        report("autocommit noop", latencies, time.perf_counter() - started, options.calls)

        latencies = []
        n_calls = 0
        started = time.perf_counter()
        for _ in range(options.sagas):
            before = time.perf_counter()
            saga = server.call("saga_begin", {})["saga_id"]
            latencies.append(time.perf_counter() - before)
            for _ in range(10):
                before = time.perf_counter()
                server.call("noop", {"saga_id": saga, "args": {}})
                latencies.append(time.perf_counter() - before)
            before = time.perf_counter()
            assert server.call("saga_commit", {"saga_id": saga})["state"] == "Done"
            latencies.append(time.perf_counter() - before)
            n_calls += 12
        elapsed = time.perf_counter() - started
        report("10-call sagas (12 calls each: begin, 10 noop, commit)", latencies, elapsed, n_calls)
        print(json.dumps({"run": "10-call sagas", "sagas_per_sec": round(options.sagas / elapsed)}))
        server.close()


if __name__ == "__main__":
    main()
