#!/usr/bin/env python3
"""The soak: each target in turn, alone, in front of bench/origin, under `oha` at a fixed rate from many
connections for a long time, over a URL set that churns past the memory tier (and past the disk tier), with a
ban every second. Every INTERVAL seconds it samples the target's resident memory (all its processes), open
file descriptors and, for lacquerd, the size of its metadata database (sled, STORE/meta). At the end it says
whether each levels off, comparing the mean of the last third of the samples with the middle third (the
first third is warm-up), and counts errors (connection errors and non-200 answers), which must be 0.

lacquerd bans `req.url ~ …` through its admin API; Varnish bans `obj.http.x-url ~ …` through varnishadm (the
form its lurker walks); NGINX open source has no bans, so it runs the same load without them."""

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402
from compare import ROOT, nginx_conf, sh, stop, tree, wait_port  # noqa: E402

# Ports of its own, 100 below the other benchmarks', so that a soak can run beside one of them.
ORIGIN_PORT = compare.ORIGIN_PORT = 8880
TARGETS = {"lacquer": 8881, "varnish": 8882, "nginx": 8883}
ADMIN_PORT = 8791
VARNISH_ADMIN = "127.0.0.1:8792"
MIB = 1024 * 1024


def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def open_fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def dir_bytes(path):
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass
    return total


class Target:
    """One proxy under load: how to start it, ban on it, and which directory is its metadata database."""

    def __init__(self, name, work, args):
        self.name, self.work, self.args, self.procs = name, work, args, []
        self.port = TARGETS[name]
        self.meta_dir = None

    def start(self):
        a = self.args
        if self.name == "lacquer":
            store = f"{self.work}/lacquer"
            self.meta_dir = f"{store}/meta"
            self.procs.append(subprocess.Popen(
                [f"{ROOT}/target/release/lacquerd", "--listen", f"127.0.0.1:{self.port}",
                 "--admin", f"127.0.0.1:{ADMIN_PORT}", "--backend", f"127.0.0.1:{ORIGIN_PORT}", "--disk", store,
                 "--memory", f"{a.memory_mib}MiB", "--disk-size", f"{a.disk_mib}MiB"],
                env={**os.environ, "RUST_LOG": "warn"}))
            wait_port(self.port)
            self.secret = open(f"{store}/secret").read().strip()
        elif self.name == "varnish":
            vcl = f"{self.work}/soak.vcl"
            with open(vcl, "w") as f:
                f.write(f'vcl 4.1;\nbackend origin {{ .host = "127.0.0.1"; .port = "{ORIGIN_PORT}"; }}\n')
            self.procs.append(subprocess.Popen(
                ["/usr/sbin/varnishd", "-F", "-j", "none", "-n", f"{self.work}/varnish",
                 "-a", f"127.0.0.1:{self.port}", "-f", vcl, "-s", f"malloc,{a.memory_mib}m",
                 "-T", VARNISH_ADMIN, "-p", "ban_lurker_age=0"],
                stdout=subprocess.DEVNULL))
            wait_port(self.port)
        else:
            conf = nginx_conf(self.work, f"listen 127.0.0.1:{self.port} backlog=4096;")
            with open(conf) as f:
                text = f.read().replace("max_size=2g", f"max_size={a.disk_mib}m")
            with open(conf, "w") as f:
                f.write(text)
            self.procs.append(subprocess.Popen(["/usr/sbin/nginx", "-c", conf, "-p", self.work],
                                               stdout=subprocess.DEVNULL))
            wait_port(self.port)

    def pids(self):
        return tree(self.procs[0].pid)

    def ban(self, suffix):
        """Bans the objects whose URL ends in `suffix`; returns False when the target has no bans."""
        pattern = f"^/sized/{self.args.size}/[0-9]*{suffix}$"
        if self.name == "lacquer":
            req = urllib.request.Request(
                f"http://127.0.0.1:{ADMIN_PORT}/v1/bans", method="POST",
                data=json.dumps({"expression": f"req.url ~ {pattern}"}).encode(),
                headers={"authorization": f"Bearer {self.secret}", "content-type": "application/json"})
            urllib.request.urlopen(req, timeout=5).read()
            return True
        if self.name == "varnish":
            sh(["varnishadm", "-n", f"{self.work}/varnish", "ban", "obj.http.x-url", "~", pattern])
            return True
        return False

    def stats(self):
        if self.name != "lacquer":
            return None
        req = urllib.request.Request(f"http://127.0.0.1:{ADMIN_PORT}/v1/stats",
                                     headers={"authorization": f"Bearer {self.secret}"})
        return json.loads(urllib.request.urlopen(req, timeout=5).read())


def sample(target):
    rss = fds = 0
    for pid in target.pids():
        try:
            rss += rss_bytes(pid)
            fds += open_fds(pid)
        except OSError:
            pass
    meta = dir_bytes(target.meta_dir) if target.meta_dir else None
    return {"rss": rss, "fds": fds, "meta": meta}


def levels_off(values, slack):
    """Whether a series has stopped growing: the mean of its last third is within 10 % (plus `slack`, for
    small numbers) of the mean of its middle third. Returns (verdict, middle mean, last mean)."""
    third = len(values) // 3
    if third == 0:
        return None, None, None
    middle = statistics.mean(values[third:2 * third])
    last = statistics.mean(values[2 * third:])
    return last <= middle * 1.10 + slack, middle, last


def soak(name, args):
    work = tempfile.mkdtemp(prefix=f"soak-{name}-")
    origin = subprocess.Popen([f"{ROOT}/target/release/bench-origin", str(ORIGIN_PORT)])
    target = Target(name, work, args)
    try:
        wait_port(ORIGIN_PORT)
        target.start()
        url = f"http://127.0.0.1:{target.port}/sized/{args.size}/[0-9]{{{len(str(args.keys - 1))}}}"
        if 10 ** len(str(args.keys - 1)) != args.keys:
            raise SystemExit("--keys must be a power of ten (the URL regex draws that many digits)")
        oha = subprocess.Popen(
            ["oha", "--no-tui", "--output-format", "json", "-z", f"{args.duration}s", "-q", str(args.rate),
             "-c", str(args.connections), "--latency-correction", "--wait-ongoing-requests-after-deadline",
             "--rand-regex-url", url],
            stdout=subprocess.PIPE, text=True)
        samples, bans, ban_errors = [], 0, 0
        stopping = threading.Event()

        def banner():
            nonlocal bans, ban_errors
            while not stopping.wait(1.0):
                try:
                    if not target.ban(f"{random.randrange(100):02d}"):
                        return
                    bans += 1
                except Exception as e:  # noqa: BLE001 — counted and reported, the soak goes on
                    ban_errors += 1
                    print(f"ban failed: {e}", file=sys.stderr)

        ban_thread = threading.Thread(target=banner)
        ban_thread.start()
        started = time.time()
        died = None
        # Samples stop with the load: the last requests draining would read as descriptors given back.
        while oha.poll() is None and time.time() < started + args.duration - 1:
            if died is None and target.procs[0].poll() is not None:
                died = round(time.time() - started)
                print(f"  {name} exited with {target.procs[0].returncode} at {died} s", file=sys.stderr)
            s = sample(target)
            s["t"] = round(time.time() - started)
            samples.append(s)
            meta = f"{s['meta'] / MIB:8.1f}" if s["meta"] is not None else "       -"
            print(f"  {name:8} t={s['t']:4}s rss={s['rss'] / MIB:8.1f} MiB fds={s['fds']:6} meta={meta} MiB",
                  file=sys.stderr, flush=True)
            deadline = time.time() + args.interval
            while oha.poll() is None and time.time() < deadline:
                time.sleep(0.2)
        stopping.set()
        ban_thread.join()
        result = json.loads(oha.communicate()[0])
        stats = target.stats() if died is None else None
        out = summarise(name, args, result, samples, bans, ban_errors, stats)
        if died is not None:
            out["errors"] += 1
            out["error_detail"]["exited at s"] = died
        return out
    finally:
        stop(target.procs + [origin], work)


def summarise(name, args, result, samples, bans, ban_errors, stats):
    codes = {int(k): v for k, v in result.get("statusCodeDistribution", {}).items()}
    conn_errors = sum(result.get("errorDistribution", {}).values())
    bad_status = sum(v for k, v in codes.items() if k != 200)
    out = {
        "target": name,
        "requests": sum(codes.values()) + conn_errors,
        "rps": result["summary"]["requestsPerSec"],
        "p99_ms": (result.get("latencyPercentiles", {}).get("p99") or 0) * 1000,
        "errors": conn_errors + bad_status + ban_errors,
        "error_detail": {**{str(k): v for k, v in codes.items() if k != 200},
                         **result.get("errorDistribution", {}),
                         **({"ban": ban_errors} if ban_errors else {})},
        "bans": bans,
        "samples": samples,
    }
    for key, slack in (("rss", 16 * MIB), ("fds", 32), ("meta", 8 * MIB)):
        series = [s[key] for s in samples if s[key] is not None]
        out[key] = levels_off(series, slack) if series else (None, None, None)
    if stats:
        p = stats["proxy"]
        out["lacquer"] = {k: p[k] for k in ("requests", "hits", "misses", "backend_errors", "objects_stored")}
    return out


def report(results, args):
    print(f"\nSoak: {args.duration} s per target at {args.rate} rps from {args.connections} connections, "
          f"{args.keys} URLs of {args.size} B ({args.keys * args.size / MIB:.0f} MiB), memory tier "
          f"{args.memory_mib} MiB, disk {args.disk_mib} MiB, a ban each second (lacquerd, Varnish); samples "
          f"every {args.interval} s.\n")
    print("| target | requests | rps | p99 ms | errors | bans | RSS middle → last third (MiB) | fds middle → last "
          "| sled middle → last (MiB) |")
    print("|---|---|---|---|---|---|---|---|---|")

    def fmt(triple, scale, unit_fmt):
        ok, middle, last = triple
        if ok is None:
            return "-"
        return f"{unit_fmt.format(middle / scale)} → {unit_fmt.format(last / scale)} " + \
            ("(levels off)" if ok else "(GROWING)")

    for r in results:
        print(f"| {r['target']} | {r['requests']} | {r['rps']:.0f} | {r['p99_ms']:.1f} | {r['errors']} "
              f"{json.dumps(r['error_detail']) if r['errors'] else ''}| {r['bans']} | {fmt(r['rss'], MIB, '{:.0f}')} "
              f"| {fmt(r['fds'], 1, '{:.0f}')} | {fmt(r['meta'], MIB, '{:.1f}')} |")
    for r in results:
        if "lacquer" in r:
            print(f"\nlacquerd counters: {json.dumps(r['lacquer'])}")
    failed = [r["target"] for r in results if r["errors"] or any(r[k][0] is False for k in ("rss", "fds", "meta"))]
    if failed:
        print(f"\nFAILED: {', '.join(failed)} (errors, or a series still growing)")
    return not failed


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=int, default=600, help="seconds of load per target (default 600)")
    ap.add_argument("--rate", type=int, default=5000, help="requests per second (default 5000)")
    ap.add_argument("--connections", type=int, default=1000, help="client connections (default 1000)")
    ap.add_argument("--keys", type=int, default=100000, help="distinct URLs, a power of ten (default 100000)")
    ap.add_argument("--size", type=int, default=16384, help="bytes per object (default 16384)")
    ap.add_argument("--memory-mib", type=int, default=64, help="memory tier / malloc storage (default 64)")
    ap.add_argument("--disk-mib", type=int, default=1024, help="lacquerd disk tier, NGINX max_size (default 1024)")
    ap.add_argument("--interval", type=int, default=10, help="seconds between samples (default 10)")
    ap.add_argument("--targets", default="lacquer,varnish,nginx", help="comma-separated (default all three)")
    args = ap.parse_args()
    # 1000 connections do not fit in the usual soft limit of 1024 descriptors; the package gives lacquerd
    # far more (lacquer.service: LimitNOFILE=1048576), here every process gets the hard limit.
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    results = [soak(name, args) for name in args.targets.split(",")]
    sys.exit(0 if report(results, args) else 1)


if __name__ == "__main__":
    main()
