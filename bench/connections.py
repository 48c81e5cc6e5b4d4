#!/usr/bin/env python3
"""Memory per keep-alive connection: what a proxy holds for each client connection that has been served and
sits idle (a player between segments, a browser between pages), and for each whose reader stopped mid-body.
For each target, protocol and object size, N connections each GET one cached object and read it whole, then
stay open; the proxy's resident memory (all its processes) is read before, with the N idle connections open,
and after they closed.

    python3 bench/connections.py                          # 500 connections, every case below, 3 rounds
    python3 bench/connections.py --connections 2000 --targets lacquer,nginx --cases h1-4MiB,slow-4MiB

Cases (`--cases`): `h1-SIZE` (HTTP/1.1), `h2c-SIZE` (HTTP/2 by prior knowledge, Python's h2), `h3-SIZE`
(HTTP/3 with aioquic, lacquerd alone: Debian's NGINX 1.22 and Varnish have none) for the sizes 2KiB, 25KiB
and 4MiB; `slow-4MiB`: HTTP/1.1 readers that take the head and 64 KiB of a 4 MiB hit and then stop reading
with the connection open. Needs `pip install h2 aioquic==1.2.0` for the h2c and h3 cases.

Reported per target and case: KiB per idle connection ((open - before) / N) and KiB per connection still
held once they closed; lacquer / other ratios are medians of per-round ratios. lacquerd runs with
`_RJEM_MALLOC_CONF=dirty_decay_ms:0,muzzy_decay_ms:0`, so its RSS is what it holds, not pages jemalloc keeps
for reuse. Ports: origin 8860 (control 8859), lacquerd 8861 (admin 8891, HTTP/3 8865), Varnish 8862
(-T 8892), NGINX 8863 (h2c 8864), so it can run beside the other benchmarks."""

import argparse
import asyncio
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402
from compare import ROOT, nginx_conf, tree  # noqa: E402
from edge import certificate  # noqa: E402

ORIGIN, CONTROL = 8860, 8859
PORTS = {"lacquer": 8861, "varnish": 8862, "nginx": 8863}
# Where each target speaks h2c, and lacquerd HTTP/3 (Varnish's h2c is on its one port).
H2C_PORTS = {"lacquer": 8861, "varnish": 8862, "nginx": 8864}
H3_PORT = 8865
# bench-origin's cacheable objects: a manifest-sized one, an LL-HLS part-sized one, a segment.
SIZES = {"2KiB": "/obj/2k", "25KiB": "/sized/25600/conn", "4MiB": "/obj/4m"}
CASES = [f"{proto}-{size}" for proto in ("h1", "h2c", "h3") for size in SIZES] + ["slow-4MiB"]
# What a slow reader takes of its body before it stops reading.
SLOW_READ = 64 * 1024


def rss_kib(pids):
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        except (FileNotFoundError, StopIteration):
            pass
    return total


def wait_port(port, path="/obj/2k", timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2).read()
            return
        except Exception:
            time.sleep(0.2)
    raise SystemExit(f"nothing answers on port {port}")


def start(work, targets, lacquerd):
    procs = {"origin": subprocess.Popen([f"{ROOT}/target/release/bench-origin", str(ORIGIN), str(CONTROL)])}
    if "lacquer" in targets:
        cert, key = certificate(work)
        config = f"{work}/lacquer.toml"
        with open(config, "w") as f:
            f.write(f"""
[[backend]]
address = "127.0.0.1:{ORIGIN}"
[[listen]]
address = "127.0.0.1:{PORTS['lacquer']}"
max_connections_per_ip = 0
[[listen]]
address = "127.0.0.1:{H3_PORT}"
tls = [{{ cert = "{cert}", key = "{key}" }}]
quic = true
max_connections_per_ip = 0
""")
        procs["lacquer"] = subprocess.Popen(
            [lacquerd, "--config", config, "--admin", "127.0.0.1:8891", "--disk", f"{work}/lacquer",
             "--memory", "256MiB", "--disk-size", "2GiB"],
            env={**os.environ, "RUST_LOG": "warn", "_RJEM_MALLOC_CONF": "dirty_decay_ms:0,muzzy_decay_ms:0"})
    if "varnish" in targets:
        procs["varnish"] = compare.varnish(work, PORTS["varnish"], 8892, ORIGIN, params=["feature=+http2"])
    if "nginx" in targets:
        # Idle keep-alive connections are what is measured: none may be closed by NGINX meanwhile.
        conf = nginx_conf(work, f"listen 127.0.0.1:{PORTS['nginx']};\n        listen 127.0.0.1:{H2C_PORTS['nginx']} http2;",
                          "keepalive_requests 100000; keepalive_timeout 300s;",
                          origin_port=ORIGIN)
        procs["nginx"] = subprocess.Popen(["/usr/sbin/nginx", "-c", conf, "-p", work], stdout=subprocess.DEVNULL)
    wait_port(ORIGIN)
    for t in targets:
        wait_port(PORTS[t])
    return procs


def read_response(sock):
    """Reads one 200 response whole, framed by Content-Length or chunked; fails loudly on anything else."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise RuntimeError("connection closed before the head")
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    fields = {line.split(b":", 1)[0].strip().lower(): line.split(b":", 1)[1].strip()
              for line in head.split(b"\r\n")[1:] if b":" in line}
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"unexpected answer: {head[:300]!r}")

    def more():
        chunk = sock.recv(1 << 20)
        if not chunk:
            raise RuntimeError("connection closed mid-body")
        return chunk

    if b"content-length" in fields:
        while len(body) < int(fields[b"content-length"]):
            body += more()
        return
    # Chunked: read until the last chunk's empty line.
    while not body.endswith(b"\r\n0\r\n\r\n") and body != b"0\r\n\r\n":
        body += more()


def h1_open(port, path):
    """An HTTP/1.1 connection with one request sent."""
    s = socket.create_connection(("127.0.0.1", port))
    s.settimeout(30)
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: bench\r\n\r\n".encode())
    return s


def h2c_open(port, path):
    """An HTTP/2 connection (prior knowledge) that read one response whole, window handed back as it came."""
    import h2.config
    import h2.connection
    import h2.events
    s = socket.create_connection(("127.0.0.1", port))
    s.settimeout(30)
    c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
    c.initiate_connection()
    c.send_headers(1, [(b":method", b"GET"), (b":scheme", b"http"), (b":authority", b"bench"),
                       (b":path", path.encode())], end_stream=True)
    s.sendall(c.data_to_send())
    done = False
    while not done:
        data = s.recv(1 << 20)
        if not data:
            raise RuntimeError("h2c: connection closed mid-response")
        for event in c.receive_data(data):
            if isinstance(event, h2.events.ResponseReceived):
                status = dict(event.headers).get(b":status")
                if status != b"200":
                    raise RuntimeError(f"h2c: unexpected status {status!r}")
            elif isinstance(event, h2.events.DataReceived):
                c.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, (h2.events.StreamReset, h2.events.ConnectionTerminated)):
                raise RuntimeError(f"h2c: {event}")
            elif isinstance(event, h2.events.StreamEnded):
                done = True
        out = c.data_to_send()
        if out:
            s.sendall(out)
    return s


async def h3_open(port, path, n):
    """n HTTP/3 connections, each having read one response whole; returns them with a closer."""
    from contextlib import AsyncExitStack
    from aioquic.asyncio.client import connect
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import h3client
    stack = AsyncExitStack()
    for _ in range(n):
        client = await stack.enter_async_context(connect(
            "127.0.0.1", port, configuration=h3client.configuration({"server_name": "bench.test"}, {}),
            create_protocol=h3client.Client))
        client.server_name = "bench.test"
        stream = client.request({"path": path})
        await asyncio.wait_for(stream.done, 60)
        if stream.status != 200 or stream.error:
            raise RuntimeError(f"h3: {stream.result()}")
    return stack


def measure(target, case, pids, n):
    proto, size = case.split("-", 1)
    path = SIZES[size]
    for _ in range(2):
        urllib.request.urlopen(f"http://127.0.0.1:{PORTS[target]}{path}", timeout=10).read()
    time.sleep(1)
    before = rss_kib(pids)
    socks, stack, loop = [], None, None
    if proto in ("h1", "slow"):
        socks = [h1_open(PORTS[target], path) for _ in range(n)]
        for s in socks:
            if proto == "slow":
                taken = 0
                while taken < SLOW_READ:
                    chunk = s.recv(SLOW_READ - taken)
                    if not chunk:
                        raise RuntimeError("closed before the slow reader's share")
                    taken += len(chunk)
            else:
                read_response(s)
    elif proto == "h2c":
        socks = [h2c_open(H2C_PORTS[target], path) for _ in range(n)]
    else:
        loop = asyncio.new_event_loop()
        stack = loop.run_until_complete(h3_open(H3_PORT, path, n))
    time.sleep(2)
    idle = rss_kib(pids)
    for s in socks:
        s.close()
    if stack is not None:
        loop.run_until_complete(stack.aclose())
        loop.close()
    time.sleep(3)
    after = rss_kib(pids)
    return (idle - before) / n, (after - before) / n


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--connections", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--targets", default="lacquer,nginx,varnish")
    ap.add_argument("--cases", default=",".join(CASES), help="of: " + ", ".join(CASES))
    ap.add_argument("--lacquerd", default=os.environ.get("LACQUERD", f"{ROOT}/target/release/lacquerd"))
    args = ap.parse_args()
    targets = args.targets.split(",")
    cases = args.cases.split(",")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4 * args.connections + 1024)), hard))
    print(f"load average at start: {os.getloadavg()}")
    results = {}
    with tempfile.TemporaryDirectory() as work:
        procs = start(work, targets, args.lacquerd)
        try:
            for r in range(args.rounds):
                order = targets[r % len(targets):] + targets[:r % len(targets)]
                for case in cases:
                    for t in order:
                        if case.startswith("h3") and t != "lacquer":
                            continue
                        pids = tree(procs[t].pid)
                        open_kib, left_kib = measure(t, case, pids, args.connections)
                        results.setdefault((t, case), []).append((open_kib, left_kib))
                        print(f"round {r + 1} {t:8} {case:10} idle {open_kib:8.1f} KiB/conn, "
                              f"after closing {left_kib:8.1f} KiB/conn", flush=True)
        finally:
            for p in procs.values():
                p.terminate()
            for p in procs.values():
                p.wait()
    print(f"\nload average at end: {os.getloadavg()}")
    print(f"\n{args.connections} idle keep-alive connections, median of {args.rounds} rounds (KiB per connection)")
    print(f"{'case':10}" + "".join(f"{t:>22}" for t in targets) + "".join(
        f"{'lacquer/' + t:>18}" for t in targets if t != "lacquer" and "lacquer" in targets))
    for case in cases:
        row = f"{case:10}"
        for t in targets:
            runs = results.get((t, case))
            row += (f"{statistics.median(o for o, _ in runs):12.1f} ({statistics.median(a for _, a in runs):6.1f})"
                    if runs else f"{'-':>22}")
        if "lacquer" in targets:
            for t in targets:
                if t == "lacquer":
                    continue
                if (t, case) not in results:
                    row += f"{'-':>18}"
                    continue
                ratios = [lo / max(o, 0.1) for (lo, _), (o, _) in zip(results[("lacquer", case)], results[(t, case)])]
                row += f"{statistics.median(ratios):18.2f}"
        print(row)
    print("(idle, and in brackets what is still held once they closed)")


if __name__ == "__main__":
    main()
