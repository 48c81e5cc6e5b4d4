#!/usr/bin/env python3
"""CPU per hit over TLS and HTTP/2, the way browsers arrive: bench/cpu.py's measure (each target one worker
pinned to core 0, the load and the origin on core 1, the target's process CPU divided by the requests
answered), with h2load as the client: 50 connections of 10 concurrent streams, 1 000 requests each, for the
2 KiB HLS manifest, without and with `Accept-Encoding: gzip`. Targets: every --lacquerd NAME=PATH (a
listener with a self-signed ECDSA certificate made for the run) and NGINX (one worker, `listen ... ssl
http2`, proxy_cache as bench/cpu.py configures it). Medians over rounds, targets interleaved.

    python3 bench/h2tls.py --lacquerd before=/tmp/old/lacquerd --lacquerd after=target/release/lacquerd

Needs h2load (Debian's nghttp2-client) and openssl. Ports: origin 8980, lacquerd 8991-8994, NGINX 8995."""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare import CONTROL_PORT, ORIGIN_PORT, cpu_seconds, nginx_conf, wait_port  # noqa: E402
from cpu import MANIFEST, lacquerd_builds, pinned  # noqa: E402
from hotpath import NGINX_GZIP  # noqa: E402
import perf  # noqa: E402
from rss import wait_port as wait_accepting  # noqa: E402

NGINX_PORT = 8995
CLIENTS = {"identity": [], "gzip": ["-H", "accept-encoding: gzip, deflate, br"]}


def h2load(port, headers, conns, streams, per_conn):
    cmd = ["taskset", "-c", "1", "h2load", "-c", str(conns), "-m", str(streams), "-n", str(conns * per_conn),
           *headers, f"https://127.0.0.1:{port}{MANIFEST}"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    m = re.search(r"requests: \d+ total, \d+ started, \d+ done, (\d+) succeeded, (\d+) failed", out)
    if not m:
        raise RuntimeError(f"no summary from h2load:\n{out}")
    if int(m.group(2)):
        print(f"WARNING: {m.group(2)} failed requests on port {port}", flush=True)
    if "h2" not in out:
        raise RuntimeError(f"h2load did not speak HTTP/2 on port {port}:\n{out}")
    return int(m.group(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lacquerd", action="append", default=[], help="NAME=PATH, repeatable")
    ap.add_argument("--origin", default=perf.binary("bench-origin", "BENCH_ORIGIN"))
    ap.add_argument("--no-nginx", action="store_true")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--per-connection", type=int, default=1000, help="requests per connection")
    args = ap.parse_args()
    builds = lacquerd_builds(args.lacquerd)
    work = tempfile.mkdtemp(prefix="lacquer-h2tls-")
    cert, key = f"{work}/cert.pem", f"{work}/key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-subj", "/CN=localhost", "-days", "2", "-keyout", key, "-out", cert],
                   check=True, capture_output=True)
    procs, ports = {}, {}
    procs["origin"] = pinned(1, [args.origin, str(ORIGIN_PORT), str(CONTROL_PORT)])
    try:
        for i, (name, path) in enumerate(builds.items()):
            ports[name] = 8991 + i
            config = f"{work}/{name}.toml"
            with open(config, "w") as f:
                f.write(f'[server]\nworkers = 1\n[[backend]]\naddress = "127.0.0.1:{ORIGIN_PORT}"\n'
                        f'[[listen]]\naddress = "127.0.0.1:{ports[name]}"\n'
                        f'tls = [{{ cert = "{cert}", key = "{key}" }}]\n')
            procs[name] = pinned(0, [path, "--config", config, "--admin", f"127.0.0.1:{8981 + i}",
                                     "--disk", f"{work}/{name}", "--memory", "256MiB", "--disk-size", "1GiB"],
                                 env={**os.environ, "RUST_LOG": "warn"})
        if not args.no_nginx:
            listen = (f"listen 127.0.0.1:{NGINX_PORT} ssl http2;\n        ssl_certificate {cert};\n"
                      f"        ssl_certificate_key {key};\n        keepalive_requests 100000;")
            conf = nginx_conf(work, listen, NGINX_GZIP.format(level=1), origin_port=ORIGIN_PORT)
            with open(conf) as f:
                text = f.read().replace("worker_processes 2;", "worker_processes 1;")
            with open(conf, "w") as f:
                f.write(text)
            procs["nginx"] = pinned(0, ["/usr/sbin/nginx", "-c", conf, "-p", work], stdout=subprocess.DEVNULL)
            ports["nginx"] = NGINX_PORT
        wait_port(ORIGIN_PORT)
        for port in ports.values():
            # A TLS listener refuses wait_port's plain HTTP: any connection accepted will do.
            wait_accepting(port, 20)
        targets = list(ports)
        for t in targets:
            for headers in CLIENTS.values():
                h2load(ports[t], headers, 1, 1, 5)
        results = {}
        for r in range(args.rounds):
            order = targets[r % len(targets):] + targets[:r % len(targets)]
            for client, headers in CLIENTS.items():
                for t in order:
                    before = cpu_seconds(procs[t].pid)
                    n = h2load(ports[t], headers, 50, 10, args.per_connection)
                    us = (cpu_seconds(procs[t].pid) - before) * 1e6 / n
                    results.setdefault((client, t), []).append(us)
                    print(f"round {r + 1} {client:9} {t:10} {us:6.1f} us CPU/request ({n} requests)", flush=True)
        print(f"\nmedian of {args.rounds} rounds; h2load -c50 -m10, {args.per_connection} requests per "
              f"connection over TLS 1.3 + HTTP/2; target CPU per request in µs\n")
        others = [t for t in targets if t != "nginx"]
        print("| client | " + " | ".join(targets) + " |" +
              "".join(f" {t} / nginx |" for t in others if "nginx" in targets))
        print("|---" * (1 + len(targets) + (len(others) if "nginx" in targets else 0)) + "|")
        for client in CLIENTS:
            row = f"| {client} | " + " | ".join(
                f"{statistics.median(results[(client, t)]):.1f}" for t in targets) + " |"
            if "nginx" in targets:
                for t in others:
                    ratios = [a / b for a, b in zip(results[(client, t)], results[(client, "nginx")])]
                    row += f" {statistics.median(ratios):.2f} |"
            print(row)
    finally:
        for p in procs.values():
            p.terminate()
        for p in procs.values():
            p.wait()
        time.sleep(0.2)
        subprocess.run(["rm", "-rf", work])


if __name__ == "__main__":
    main()
