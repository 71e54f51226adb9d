"""Times the operator console's routes on a big log, from a client on loopback.

    cargo build --release -p agent-kernel-cli
    mkdir -p /tmp/big && target/release/agent-kernel bench --sagas 100000 --steps 10 \
        --concurrency 64 --durability normal --keep-log /tmp/big/log.db
    python3 benches/console/measure.py /tmp/big/log.db [target/release/agent-kernel]

Prints one Markdown table row per route: requests, p50 and p99 in ms.
"""
import json, os, subprocess, sys, time, http.client, statistics

db = sys.argv[1]
binary = os.path.abspath(sys.argv[2] if len(sys.argv) > 2 else "target/release/agent-kernel")
proc = subprocess.Popen([binary, "--db", db, "--json", "serve", "--listen", "127.0.0.1:0"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=os.path.dirname(os.path.abspath(db)))
start = json.loads(proc.stdout.readline())
host = start["url"][len("http://"):-1]
token = open(start["token_file"]).read().strip()
def get(path, accept="application/json"):
    c = http.client.HTTPConnection(host)
    t = time.perf_counter()
    c.request("GET", path, headers={"Authorization": "Bearer " + token, "Accept": accept})
    r = c.getresponse(); body = r.read()
    dt = (time.perf_counter() - t) * 1000
    c.close()
    return r.status, body, dt
status, body, _ = get("/sagas?limit=50")
first = json.loads(body)
saga_id = first["sagas"][0]["saga_id"]
# A cursor deep in the log: after 100 pages of 500 sagas.
path = "/sagas?limit=500"
for _ in range(100):
    s, b, _ = get(path)
    nxt = json.loads(b)["next"]
    path = "/sagas?limit=500&after=" + nxt
deep = nxt
old_saga = deep.split(":", 1)[1]
cases = [
    ("list, first page (50)", "/sagas", "application/json", 200),
    ("list, page after 50,000 sagas", "/sagas?after=" + deep, "application/json", 200),
    ("list, state=Done", "/sagas?state=Done", "application/json", 200),
    ("list, tool=bench.step", "/sagas?tool=bench.step", "application/json", 200),
    ("list, first page, HTML", "/sagas", "text/html", 200),
    ("timeline, JSON", "/sagas/" + saga_id, "application/json", 200),
    ("timeline, HTML", "/sagas/" + saga_id, "text/html", 200),
    ("overview (counts by state)", "/", "application/json", 50),
    ("overview, HTML (with the pending requests and dead processes' sagas)", "/", "text/html", 50),
    ("a saga's audit records, newest saga", "/sagas/" + saga_id + "/audit", "application/json", 20),
    ("a saga's audit records, a saga 50,000 back", "/sagas/" + old_saga + "/audit", "application/json", 3),
    ("list, text matching no step (q=zzz)", "/sagas?q=zzz", "application/json", 5),
]
for name, path, accept, n in cases:
    times = []
    for _ in range(n):
        s, b, dt = get(path, accept)
        assert s == 200, (name, s, b[:200])
        times.append(dt)
    times.sort()
    p99 = times[min(len(times) - 1, int(len(times) * 0.99))]
    print(f"| {name} | {n} | {statistics.median(times):.1f} | {p99:.1f} |")

def cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

# The live-updates watcher's cost: the console's CPU over 20 s idle, without and with one
# listener on /events (with one, the counts by state are read every 2 s).
import socket
for listeners in (0, 1):
    conns = []
    for _ in range(listeners):
        c = socket.create_connection(tuple(host.rsplit(":", 1)[0:1]) + (int(host.rsplit(":", 1)[1]),))
        c.sendall(f"GET /events HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n\r\n".encode())
        conns.append(c)
    time.sleep(1)
    before = cpu_seconds(proc.pid)
    time.sleep(20)
    used = cpu_seconds(proc.pid) - before
    print(f"| idle, {listeners} listener(s) on /events | 20 s | CPU {used / 20 * 100:.1f}% of a core |")
    for c in conns:
        c.close()
proc.terminate(); proc.wait()
