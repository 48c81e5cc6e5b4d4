#!/usr/bin/env python3
"""Memory per keep-alive connection: what a proxy holds for each client connection that has been served and
sits idle (a player between segments, a browser between pages). For each target and each object size, N
connections each GET one cached object and read it whole, then stay open; the proxy's resident memory (all
its processes) is read before, with the N idle connections open, and after they closed.

    python3 bench/connections.py                          # 500 connections, 2 KiB, 25 KiB and 4 MiB, 3 rounds
    python3 bench/connections.py --connections 2000 --targets lacquer,nginx

Reported per target and size: KiB per idle connection ((open - before) / N) and KiB per connection still
held once they closed; lacquer / other ratios are medians of per-round ratios. lacquerd runs with
`_RJEM_MALLOC_CONF=dirty_decay_ms:0,muzzy_decay_ms:0`, so its RSS is what it holds, not pages jemalloc keeps
for reuse. Ports: origin 8860 (control 8859), lacquerd 8861 (admin 8891), Varnish 8862 (-T 8892), NGINX
8863, so it can run beside the other benchmarks."""

import argparse
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

ORIGIN, CONTROL = 8860, 8859
PORTS = {"lacquer": 8861, "varnish": 8862, "nginx": 8863}
# bench-origin's cacheable objects: a manifest-sized one, an LL-HLS part-sized one, a segment.
SIZES = {"2KiB": "/obj/2k", "25KiB": "/sized/25600/conn", "4MiB": "/obj/4m"}


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
        procs["lacquer"] = subprocess.Popen(
            [lacquerd, "--listen", f"127.0.0.1:{PORTS['lacquer']}",
             "--admin", "127.0.0.1:8891", "--backend", f"127.0.0.1:{ORIGIN}", "--disk", f"{work}/lacquer",
             "--memory", "256MiB", "--disk-size", "2GiB"],
            env={**os.environ, "RUST_LOG": "warn", "_RJEM_MALLOC_CONF": "dirty_decay_ms:0,muzzy_decay_ms:0"})
    if "varnish" in targets:
        procs["varnish"] = compare.varnish(work, PORTS["varnish"], 8892, ORIGIN)
    if "nginx" in targets:
        # Idle keep-alive connections are what is measured: none may be closed by NGINX meanwhile.
        conf = nginx_conf(work, f"listen 127.0.0.1:{PORTS['nginx']};",
                          "keepalive_requests 100000; keepalive_timeout 300s;", origin_port=ORIGIN)
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


def measure(port, pids, path, n):
    request = f"GET {path} HTTP/1.1\r\nHost: bench\r\n\r\n".encode()
    for _ in range(2):
        urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10).read()
    time.sleep(1)
    before = rss_kib(pids)
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port))
        s.settimeout(30)
        s.sendall(request)
        socks.append(s)
    for s in socks:
        read_response(s)
    time.sleep(2)
    idle = rss_kib(pids)
    for s in socks:
        s.close()
    time.sleep(3)
    after = rss_kib(pids)
    return (idle - before) / n, (after - before) / n


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--connections", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--targets", default="lacquer,nginx,varnish")
    ap.add_argument("--sizes", default=",".join(SIZES), help="of: " + ", ".join(SIZES))
    ap.add_argument("--lacquerd", default=os.environ.get("LACQUERD", f"{ROOT}/target/release/lacquerd"))
    args = ap.parse_args()
    targets = args.targets.split(",")
    sizes = args.sizes.split(",")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4 * args.connections + 1024)), hard))
    print(f"load average at start: {os.getloadavg()}")
    results = {}
    with tempfile.TemporaryDirectory() as work:
        procs = start(work, targets, args.lacquerd)
        try:
            for r in range(args.rounds):
                order = targets[r % len(targets):] + targets[:r % len(targets)]
                for size in sizes:
                    for t in order:
                        pids = tree(procs[t].pid)
                        open_kib, left_kib = measure(PORTS[t], pids, SIZES[size], args.connections)
                        results.setdefault((t, size), []).append((open_kib, left_kib))
                        print(f"round {r + 1} {t:8} {size:6} idle {open_kib:8.1f} KiB/conn, "
                              f"after closing {left_kib:8.1f} KiB/conn", flush=True)
        finally:
            for p in procs.values():
                p.terminate()
            for p in procs.values():
                p.wait()
    print(f"\nload average at end: {os.getloadavg()}")
    print(f"\n{args.connections} idle keep-alive connections, median of {args.rounds} rounds (KiB per connection)")
    print(f"{'size':8}" + "".join(f"{t:>22}" for t in targets) + "".join(
        f"{'lacquer/' + t:>18}" for t in targets if t != "lacquer" and "lacquer" in targets))
    for size in sizes:
        row = f"{size:8}"
        for t in targets:
            runs = results[(t, size)]
            row += f"{statistics.median(o for o, _ in runs):12.1f} ({statistics.median(a for _, a in runs):6.1f})"
        if "lacquer" in targets:
            for t in targets:
                if t == "lacquer":
                    continue
                ratios = [lo / max(o, 0.1) for (lo, _), (o, _) in zip(results[("lacquer", size)], results[(t, size)])]
                row += f"{statistics.median(ratios):18.2f}"
        print(row)
    print("(idle, and in brackets what is still held once they closed)")


if __name__ == "__main__":
    main()
