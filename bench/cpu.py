#!/usr/bin/env python3
"""CPU per request, the measure that holds on a shared 2-core machine where rates swing with the neighbours:
each target runs one worker pinned to core 0, wrk (-t1) and bench-origin run on core 1, and the target's
process CPU (user + system, all its processes, /proc/PID/stat) is divided by the requests wrk completed.
Medians over rounds, targets interleaved and rotated.

    python3 bench/cpu.py                                   # lacquer (target/release) and NGINX, 3 rounds
    python3 bench/cpu.py --lacquerd before=/tmp/old/lacquerd --lacquerd after=target/release/lacquerd

Workloads: `hit-identity` (the 2 KiB HLS manifest, a client sending no Accept-Encoding, 100 connections),
`hit-gzip` (the same with `Accept-Encoding: gzip, deflate, br`), `miss` (every request a new 1 KiB URL,
50 connections). NGINX runs one worker with proxy_cache and the gzip filter, as bench/hotpath.py configures
it. Ports: origin 8980 (control 8979), lacquerd 8971-8974, NGINX 8975."""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare import CONTROL_PORT, ORIGIN_PORT, ROOT, nginx_conf, sh, tree, wait_port  # noqa: E402
from hotpath import NGINX_GZIP, WRK_NEW_URLS, WRK_REPORT  # noqa: E402

MANIFEST = "/hls/channel-7/720p.m3u8"
GZIP = "gzip, deflate, br"
WORKLOADS = {
    "hit-identity": (MANIFEST, None, 100, "report"),
    "hit-gzip": (MANIFEST, GZIP, 100, "report"),
    "miss": ("/new/", None, 50, "new-urls"),
}
NGINX_PORT = 8975


def pinned(core, cmd, **kw):
    return subprocess.Popen(["taskset", "-c", str(core), *cmd], **kw)


def cpu_seconds(pid):
    ticks = 0
    for p in tree(pid):
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def wrk(scripts, port, path, conns, seconds, header, script, run):
    cmd = ["taskset", "-c", "1", "wrk", "-t1", f"-c{conns}", f"-d{seconds}s", "-s", f"{scripts}/{script}.lua"]
    if header:
        cmd += ["-H", f"Accept-Encoding: {header}"]
    cmd += [f"http://127.0.0.1:{port}{path}"]
    if script == "new-urls":
        cmd += ["--", f"/new/{port}-{run}-"]
    for line in sh(cmd).splitlines():
        if line.startswith("WRKJSON "):
            res = json.loads(line[len("WRKJSON "):])
            if any(res[k] for k in ("connect", "read", "write", "status", "timeout")):
                raise RuntimeError(f"wrk errors on {port}{path}: {res}")
            return res["requests"]
    raise RuntimeError("no report from wrk")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lacquerd", action="append", default=[],
                    help="NAME=PATH, repeatable (default: lacquer=target/release/lacquerd)")
    ap.add_argument("--no-nginx", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--only", default=",".join(WORKLOADS))
    args = ap.parse_args()
    builds = dict(b.split("=", 1) for b in args.lacquerd) or {"lacquer": f"{ROOT}/target/release/lacquerd"}
    work = tempfile.mkdtemp(prefix="lacquer-cpu-")
    scripts = f"{work}/lua"
    os.makedirs(scripts)
    for name, text in (("report", WRK_REPORT), ("new-urls", WRK_NEW_URLS)):
        with open(f"{scripts}/{name}.lua", "w") as f:
            f.write(text)
    procs, ports = {}, {}
    procs["origin"] = pinned(1, [f"{ROOT}/target/release/bench-origin", str(ORIGIN_PORT), str(CONTROL_PORT)])
    try:
        for i, (name, path) in enumerate(builds.items()):
            ports[name] = 8971 + i
            config = f"{work}/{name}.toml"
            with open(config, "w") as f:
                f.write(f'[server]\nworkers = 1\n[[backend]]\naddress = "127.0.0.1:{ORIGIN_PORT}"\n'
                        f'[[listen]]\naddress = "127.0.0.1:{ports[name]}"\n')
            procs[name] = pinned(0, [path, "--config", config, "--admin", f"127.0.0.1:{8961 + i}",
                                     "--disk", f"{work}/{name}", "--memory", "256MiB", "--disk-size", "1GiB"],
                                 env={**os.environ, "RUST_LOG": "warn"})
        if not args.no_nginx:
            conf = nginx_conf(work, f"listen 127.0.0.1:{NGINX_PORT};", NGINX_GZIP.format(level=1),
                              origin_port=ORIGIN_PORT)
            with open(conf) as f:
                text = f.read().replace("worker_processes 2;", "worker_processes 1;")
            with open(conf, "w") as f:
                f.write(text)
            procs["nginx"] = pinned(0, ["/usr/sbin/nginx", "-c", conf, "-p", work], stdout=subprocess.DEVNULL)
            ports["nginx"] = NGINX_PORT
        wait_port(ORIGIN_PORT)
        for port in ports.values():
            wait_port(port)
        targets = list(ports)
        results = {}
        print(f"load average at start: {os.getloadavg()}", flush=True)
        for r in range(args.rounds):
            order = targets[r % len(targets):] + targets[:r % len(targets)]
            for workload in args.only.split(","):
                path, header, conns, script = WORKLOADS[workload]
                for t in order:
                    if script == "report":
                        wrk(scripts, ports[t], path, 10, 1, header, script, r)
                    before = cpu_seconds(procs[t].pid)
                    n = wrk(scripts, ports[t], path, conns, args.seconds, header, script, r)
                    us = (cpu_seconds(procs[t].pid) - before) * 1e6 / n
                    results.setdefault((workload, t), []).append(us)
                    print(f"round {r + 1} {workload:13} {t:10} {us:6.1f} us CPU/request ({n} requests)",
                          flush=True)
        print(f"load average at end: {os.getloadavg()}\n")
        print("| workload | " + " | ".join(targets) + " |" + "".join(
            f" {t} / nginx |" for t in targets if t != "nginx" and "nginx" in targets))
        print("|---" * (1 + len(targets) + sum(t != "nginx" and "nginx" in targets for t in targets)) + "|")
        for workload in args.only.split(","):
            row = f"| {workload} (us CPU per request) | " + " | ".join(
                f"{statistics.median(results[(workload, t)]):.1f}" for t in targets) + " |"
            for t in targets:
                if t != "nginx" and "nginx" in targets:
                    ratios = [a / b for a, b in zip(results[(workload, t)], results[(workload, "nginx")])]
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
