#!/usr/bin/env python3
"""Memory under slow readers of huge responses: lacquerd, Varnish (default VCL; Debian 12's Varnish 7.1 has
no `beresp.transit_buffer`, which came with 7.2) and NGINX (default proxy buffering) one after the other in front of the same origin. For each target and each kind of response
(cacheable, no-store), CLIENTS clients each ask for their own 2 GiB response and read it at about RATE bytes
per second for SECONDS seconds; the proxy's resident memory (all its processes) is sampled every second.
Reported: the growth over the idle baseline at its highest, what is still held 5 s after the clients left,
and how many bytes the origin was read ahead of the clients. Targets alternate order between rounds; the
table shows medians over rounds."""

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare import ORIGIN_PORT, ROOT, nginx_conf, wait_port  # noqa: E402

PORTS = {"lacquer": 8981, "varnish": 8982, "nginx": 8983}
SIZE = 2 * 1024 * 1024 * 1024
MIB = 1024 * 1024


def rss_of(pids):
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
        except FileNotFoundError:
            pass
    return total


def tree(pid):
    """`pid` and all its descendants."""
    out = [pid]
    try:
        children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    except FileNotFoundError:
        children = []
    for c in children:
        out += tree(int(c))
    return out


def start_target(name, work, lacquerd):
    """Starts one proxy; returns its Popen."""
    port = PORTS[name]
    if name == "lacquer":
        return subprocess.Popen(
            [lacquerd, "--listen", f"127.0.0.1:{port}", "--admin", "127.0.0.1:8991",
             "--backend", f"127.0.0.1:{ORIGIN_PORT}", "--disk", f"{work}/lacquer", "--memory", "256MiB",
             "--disk-size", "2GiB"],
            env={**os.environ, "RUST_LOG": "warn"})
    if name == "varnish":
        vcl = f"{work}/bench.vcl"
        with open(vcl, "w") as f:
            f.write(f'vcl 4.1;\nbackend origin {{ .host = "127.0.0.1"; .port = "{ORIGIN_PORT}"; }}\n')
        return subprocess.Popen(
            ["/usr/sbin/varnishd", "-F", "-j", "none", "-n", f"{work}/varnish", "-a", f"127.0.0.1:{port}",
             "-f", vcl, "-s", "malloc,256m", "-T", "127.0.0.1:8992"],
            stdout=subprocess.DEVNULL)
    conf = nginx_conf(work, f"listen 127.0.0.1:{port};")
    return subprocess.Popen(["/usr/sbin/nginx", "-c", conf, "-p", work], stdout=subprocess.DEVNULL)


def slow_client(port, path, rate, seconds, got):
    """Asks for `path` and reads about `rate` bytes a second for `seconds`, behind a small receive buffer."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    s.connect(("127.0.0.1", port))
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: bench.test\r\n\r\n".encode())
    start = time.time()
    n = 0
    while time.time() - start < seconds:
        data = s.recv(64 * 1024)
        if not data:
            break
        n += len(data)
        ahead = n / rate - (time.time() - start)
        if ahead > 0:
            time.sleep(ahead)
    got.append(n)
    s.close()


def origin_bytes():
    """Body bytes the origin has handed to its sockets, from /proc (the origin's write counter)."""
    pid = int(subprocess.run(["pgrep", "-f", f"bench-origin {ORIGIN_PORT}"], capture_output=True,
                             text=True).stdout.split()[0])
    with open(f"/proc/{pid}/io") as f:
        for line in f:
            if line.startswith("wchar:"):
                return int(line.split()[1])
    return 0


def run_one(name, kind, args, work):
    proc = start_target(name, work, args.lacquerd)
    port = PORTS[name]
    try:
        wait_port(port)
        time.sleep(1)
        pids = tree(proc.pid)
        base = rss_of(pids)
        before = origin_bytes()
        got, threads = [], []
        for i in range(args.clients):
            path = f"/stream/{kind}/{SIZE}/{name}-{i}-{time.time_ns()}"
            t = threading.Thread(target=slow_client, args=(port, path, args.rate, args.seconds, got))
            t.start()
            threads.append(t)
        peak = base
        while any(t.is_alive() for t in threads):
            time.sleep(1)
            peak = max(peak, rss_of(tree(proc.pid)))
        read_by_clients = sum(got)
        ahead = origin_bytes() - before - read_by_clients
        time.sleep(5)
        after = rss_of(tree(proc.pid))
        return {"growth": (peak - base) / MIB, "held": (after - base) / MIB, "ahead": ahead / MIB,
                "read": read_by_clients / MIB}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        subprocess.run(["rm", "-rf", f"{work}/lacquer", f"{work}/nginx-cache", f"{work}/varnish"])


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=int, default=60)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--rate", type=int, default=1_000_000, help="bytes a second per client")
    ap.add_argument("--targets", default="lacquer,varnish,nginx")
    ap.add_argument("--lacquerd", default=f"{ROOT}/target/release/lacquerd",
                    help="the lacquerd binary (another build, to compare before and after a change)")
    args = ap.parse_args()
    targets = args.targets.split(",")
    work = tempfile.mkdtemp(prefix="lacquer-memory-")
    origin = subprocess.Popen([f"{ROOT}/target/release/bench-origin", str(ORIGIN_PORT)])
    results = {}
    try:
        wait_port(ORIGIN_PORT)
        for r in range(args.rounds):
            order = targets[r % len(targets):] + targets[:r % len(targets)]
            for kind in ["max-age=3600", "no-store"]:
                for name in order:
                    res = run_one(name, kind, args, work)
                    print(f"round {r + 1} {kind} {name}: {res}", file=sys.stderr)
                    results.setdefault((kind, name), []).append(res)
    finally:
        origin.send_signal(signal.SIGTERM)
        origin.wait()
        subprocess.run(["rm", "-rf", work])
    print(f"\n{args.clients} clients, each reading its own {SIZE // MIB} MiB response at "
          f"{args.rate / 1e6:.1f} MB/s for {args.seconds} s; medians of {args.rounds} rounds\n")
    print("| response | target | RSS growth, peak (MiB) | still held 5 s after (MiB) | origin read ahead of clients (MiB) |")
    print("|---|---|---|---|---|")
    for (kind, name), runs in results.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(f"| {kind} | {name} | {med['growth']:.0f} | {med['held']:.0f} | {med['ahead']:.0f} |")


if __name__ == "__main__":
    main()
