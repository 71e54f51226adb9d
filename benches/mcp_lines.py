"""A minimal MCP client for the benchmark scripts: raw JSON-RPC lines over a server's stdin
and stdout, standard library only (`mcp_bench.py`, `upstream_bench.py`)."""

import json
import subprocess


class LineSession:
    """A server started with `command` in `folder` (environment `env`, or this one's),
    initialized; `request` answers the result of one call."""

    def __init__(self, command, folder, env=None):
        self.process = subprocess.Popen(
            command, cwd=folder, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True, bufsize=1,
        )
        self.next_id = 0
        self.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}})
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def send(self, message):
        self.process.stdin.write(json.dumps(message) + "\n")
        self.process.stdin.flush()

    def request(self, method, params):
        self.next_id += 1
        self.send({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        while True:
            answer = json.loads(self.process.stdout.readline())
            if answer.get("id") == self.next_id:
                return answer

    def close(self):
        self.process.stdin.close()
        self.process.wait()


def percentile(samples, fraction):
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]
