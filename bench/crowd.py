#!/usr/bin/env python3
"""Issue 43: fifty thousand connections and an accept storm, lacquerd against NGINX in one run.

    python3 bench/crowd.py                                  # 50 000 connections, storm 10 000/s for 10 s
    python3 bench/crowd.py --connections 5000 --storm-rate 1000 --seconds 20    # the smoke-sized run

Per target (each with its defaults, keep-alive timeouts included, but the open-file limit, raised here for
the run as an operator raises it, to 200 000 where the machine allows, else to its hard limit, and the run
refused when that is too low; the package's unit already sets LimitNOFILE=1048576): bench-crowd (bench/origin) opens
--connections keep-alive connections, each served one cached 2 KiB playlist; half stay idle, half GET the
playlist at --rate requests per second in all for --seconds; from the middle of that window, --storm-rate
new connections a second for --storm-seconds each connect, GET the playlist once and close. Connections come
from 16 loopback source addresses (127.0.0.2-17), as a crowd comes from many clients (lacquerd's
`max_connections_per_ip` is 4096 by default).

Reported: the playlist's TTFB p50/p99/max on the active connections, the storm's connect time (SYN to the
handshake's end: the accept latency a client sees) and its TTFB counted from the connect's start, p99 and max;
errors; the idle connections still open at the end; the target's peak RSS and open file descriptors (all its
processes, sampled every 0.25 s) and its RSS per connection once the crowd is open; CPU seconds over the run.
The load average is printed. Ports: origin 8560 (control 8559), lacquerd 8561 (admin 8591), NGINX 8563."""

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402
from compare import ROOT, cpu_seconds, stop, tree, wait_port  # noqa: E402

ORIGIN, CONTROL = 8560, 8559
LACQUER, ADMIN, NGINX = 8561, 8591, 8563
PATH = "/obj/2k"
NOFILE = 200_000


def binary(name, env):
    return os.environ.get(env) or f"{ROOT}/target/release/{name}"


def nginx(work):
    """compare.py's NGINX (proxy_cache on disk, 2 workers), with room for the crowd's connections."""
    conf = compare.nginx_conf(work, f"listen 127.0.0.1:{NGINX};", origin_port=ORIGIN)
    text = open(conf).read().replace("worker_connections 4096;", "worker_connections 100000;")
    open(conf, "w").write(text.replace("daemon off;", f"daemon off;\nworker_rlimit_nofile {NOFILE};"))
    return subprocess.Popen(["/usr/sbin/nginx", "-c", conf, "-p", work], stdout=subprocess.DEVNULL)


def lacquerd(work):
    return subprocess.Popen(
        [binary("lacquerd", "LACQUERD"), "--listen", f"127.0.0.1:{LACQUER}", "--admin", f"127.0.0.1:{ADMIN}",
         "--backend", f"127.0.0.1:{ORIGIN}", "--disk", f"{work}/lacquer", "--memory", "64MiB",
         "--disk-size", "1GiB"],
        env={**os.environ, "RUST_LOG": "warn"})


def rss_and_fds(pid):
    rss, fds = 0, 0
    for p in tree(pid):
        try:
            with open(f"/proc/{p}/status") as f:
                rss += next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) * 1024
            fds += len(os.listdir(f"/proc/{p}/fd"))
        except (OSError, StopIteration):
            continue
    return rss, fds


class Sampler(threading.Thread):
    def __init__(self, pid):
        super().__init__(daemon=True)
        self.pid, self.peak_rss, self.peak_fds, self.done = pid, 0, 0, False

    def run(self):
        while not self.done:
            rss, fds = rss_and_fds(self.pid)
            self.peak_rss, self.peak_fds = max(self.peak_rss, rss), max(self.peak_fds, fds)
            time.sleep(0.25)


def crowd(port, args):
    half = args.connections // 2
    cmd = [binary("bench-crowd", "BENCH_CROWD"), "--target", f"127.0.0.1:{port}", "--path", PATH,
           "--idle", str(args.connections - half), "--active", str(half), "--rate", str(args.rate),
           "--seconds", str(args.seconds), "--storm-rate", str(args.storm_rate),
           "--storm-seconds", str(args.storm_seconds)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)


def run(target, port, pid, args):
    for _ in range(2):
        urllib.request.urlopen(f"http://127.0.0.1:{port}{PATH}", timeout=10).read()
    time.sleep(1)
    base_rss, base_fds = rss_and_fds(pid)
    sampler = Sampler(pid)
    sampler.start()
    cpu = cpu_seconds(pid)
    load = crowd(port, args)
    # The crowd is open after connections / 5000 s: RSS then is what the open connections hold.
    time.sleep(args.connections / 5000 + 2)
    open_rss, open_fds = rss_and_fds(pid)
    out, _ = load.communicate()
    sampler.done = True
    sampler.join()
    result = json.loads(out)
    result.update(
        target=target, base_rss_mib=base_rss / 2**20, peak_rss_mib=sampler.peak_rss / 2**20,
        open_rss_mib=open_rss / 2**20, open_fds=open_fds, peak_fds=sampler.peak_fds, base_fds=base_fds,
        kib_per_connection=(open_rss - base_rss) / 1024 / args.connections,
        cpu_s=cpu_seconds(pid) - cpu)
    print(json.dumps(result), file=sys.stderr)
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--connections", type=int, default=50_000)
    ap.add_argument("--rate", type=float, default=5_000, help="playlist GETs per second on the active half")
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--storm-rate", type=int, default=10_000)
    ap.add_argument("--storm-seconds", type=int, default=10)
    ap.add_argument("--targets", default="lacquer,nginx")
    args = ap.parse_args()
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))
        limit = NOFILE
    except (ValueError, OSError):
        # A container without CAP_SYS_RESOURCE keeps its hard limit: the run fits under it or says so.
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
    if args.connections + 2000 > limit:
        raise SystemExit(f"--connections {args.connections} needs an open-file limit above "
                         f"{args.connections + 2000} (each target holds one file per connection, and so does "
                         f"bench-crowd); this machine allows {limit} and refuses more")
    work = tempfile.mkdtemp(prefix="lacquer-crowd-")
    origin = subprocess.Popen([binary("bench-origin", "BENCH_ORIGIN"), str(ORIGIN), str(CONTROL)])
    procs, results = [origin], []
    try:
        wait_port(ORIGIN)
        for target in args.targets.split(","):
            proc, port = (lacquerd(work), LACQUER) if target == "lacquer" else (nginx(work), NGINX)
            procs.append(proc)
            wait_port(port)
            results.append(run(target, port, proc.pid, args))
            proc.terminate()
            proc.wait(timeout=60)
            procs.remove(proc)
            # The storm's closed connections wait in TIME_WAIT; the next target gets a quiet machine.
            time.sleep(5)
    finally:
        stop(procs, work)
    print(f"\nopen-file limit {limit}; {args.connections} connections (half idle, half at {args.rate:.0f} GETs/s in all for "
          f"{args.seconds:.0f} s), storm {args.storm_rate}/s for {args.storm_seconds} s; load {os.getloadavg()}\n")
    rows = [
        ("playlist TTFB p50 / p99 / max (ms)", lambda r: f"{r['ttfb']['p50_ms']:.2f} / {r['ttfb']['p99_ms']:.2f} / {r['ttfb']['max_ms']:.0f}"),
        ("playlist GETs answered (errors)", lambda r: f"{r['ttfb']['count']} ({r['ttfb']['errors']})"),
        ("storm connect p50 / p99 / max (ms)", lambda r: f"{r['storm_connect']['p50_ms']:.2f} / {r['storm_connect']['p99_ms']:.2f} / {r['storm_connect']['max_ms']:.0f}"),
        ("storm TTFB from connect p99 / max (ms)", lambda r: f"{r['storm_ttfb']['p99_ms']:.2f} / {r['storm_ttfb']['max_ms']:.0f}"),
        ("storm connections served (errors)", lambda r: f"{r['storm_ttfb']['count']} ({r['storm_connect']['errors'] + r['storm_ttfb']['errors']})"),
        ("crowd opened in (s) (errors)", lambda r: f"{r['open_seconds']:.1f} ({r['opening']['errors']})"),
        ("idle connections still open at the end", lambda r: f"{r['idle_open_at_end']} of {r['idle']}"),
        ("RSS: before / crowd open / peak (MiB)", lambda r: f"{r['base_rss_mib']:.0f} / {r['open_rss_mib']:.0f} / {r['peak_rss_mib']:.0f}"),
        ("RSS per open connection (KiB)", lambda r: f"{r['kib_per_connection']:.1f}"),
        ("open files: crowd open / peak", lambda r: f"{r['open_fds']} / {r['peak_fds']}"),
        ("CPU over the run (s)", lambda r: f"{r['cpu_s']:.1f}"),
    ]
    print("| | " + " | ".join(r["target"] for r in results) + " |")
    print("|---|" + "---|" * len(results))
    for label, cell in rows:
        print(f"| {label} | " + " | ".join(cell(r) for r in results) + " |")


if __name__ == "__main__":
    main()
