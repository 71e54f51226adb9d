#!/usr/bin/env python3
"""The latency agent-kernel adds to an upstream MCP server's calls: the reference memory
server called directly, and through `agent-kernel mcp` with the server declared in
tools.toml (each call a saga of its own: begin, logged step, upstream call, commit),
alternating in the same minutes. Standard library only: raw JSON-RPC lines over stdio.

    tests/upstream/run.sh    # installs the memory server under target/upstream-servers
    python3 benches/upstream_bench.py [--bin target/release/agent-kernel ...] [--calls 500] [--rounds 3]
        [--durability full|normal]

With several binaries, each is measured in every round (A/B in the same minutes).

Latency is what the client sees, from writing the request to reading its answer.
"""

import argparse
import json
import os
import tempfile
import time

from mcp_lines import LineSession, percentile

MEMORY_SERVER = "target/upstream-servers/node_modules/.bin/mcp-server-memory"


class Session(LineSession):
    def call(self, name, arguments):
        started = time.perf_counter()
        answer = self.request("tools/call", {"name": name, "arguments": arguments})
        elapsed = time.perf_counter() - started
        assert not answer["result"].get("isError"), answer
        return elapsed


def entity(round_idx, call_idx):
    return {"entities": [{"name": f"e-{round_idx}-{call_idx}", "entityType": "bench", "observations": ["x"]}]}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", nargs="+", default=["target/release/agent-kernel"])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--durability", choices=["full", "normal"], default="full")
    options = parser.parse_args()
    server = os.path.abspath(MEMORY_SERVER)
    binaries = [os.path.abspath(path) for path in options.bin]
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp")}
    results = {"direct": [], **{binary: [] for binary in binaries}}
    for round_idx in range(options.rounds):
        with tempfile.TemporaryDirectory() as folder:
            memory = os.path.join(folder, "memory.json")
            direct = Session([server], folder, {**env, "MEMORY_FILE_PATH": memory})
            samples = [direct.call("create_entities", entity(round_idx, i)) for i in range(options.calls)]
            direct.close()
            results["direct"].append(samples)
        for binary in binaries:
            with tempfile.TemporaryDirectory() as folder:
                memory = os.path.join(folder, "memory.json")
                with open(os.path.join(folder, "tools.toml"), "w") as tools:
                    tools.write(f"""
[mcp_servers.memory]
command = ["{server}"]
env = {{ MEMORY_FILE_PATH = "{memory}" }}

[mcp_servers.memory.tool.create_entities]
effect = "mutating"
compensate = {{ tool = "delete_entities", args = {{ entityNames = "$.output.entities[*].name" }} }}
""")
                command = [binary, "--db", os.path.join(folder, "bench.db"), "-q", "mcp", "--durability", options.durability]
                kernel = Session(command, folder, env)
                samples = [kernel.call("memory_create_entities", {"args": entity(round_idx, i)}) for i in range(options.calls)]
                kernel.close()
                results[binary].append(samples)
    print(f"{options.calls} create_entities calls per round, {options.rounds} rounds, alternating; the kernel's log at durability {options.durability}")
    for round_idx in range(options.rounds):
        direct = results["direct"][round_idx]
        d50, d99 = percentile(direct, 0.5) * 1e6, percentile(direct, 0.99) * 1e6
        for binary in binaries:
            kernel = results[binary][round_idx]
            k50, k99 = percentile(kernel, 0.5) * 1e6, percentile(kernel, 0.99) * 1e6
            print(
                f"round {round_idx + 1} {binary}: direct p50 {d50:.0f} µs p99 {d99:.0f} µs | through the kernel p50 {k50:.0f} µs p99 {k99:.0f} µs | added p50 {k50 - d50:.0f} µs p99 {k99 - d99:.0f} µs"
            )


if __name__ == "__main__":
    main()
