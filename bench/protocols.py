#!/usr/bin/env python3
"""Issue 29: HTTP/3 for clients and HTTP/2 to origins, each beside what it replaces, in one run. Every round runs
every target, rotating their order; tables give medians over rounds, and ratios are medians of per-round ratios.

  h3        hits over HTTP/3 (lacquerd's QUIC listener) against hits over HTTP/2 on TLS (the same lacquerd's TCP
            listener, the same port and certificate) and NGINX's HTTP/2 and HTTP/3 on TLS (Debian 12's NGINX 1.22 has
            no HTTP/3: bench/build-nginx-h3 builds Debian 13's 1.26.3 with it; without that binary, NGINX's
            HTTP/2 only). oha (built with `--features http3`) is the one
            load generator for all: for the 2 KiB manifest and the 4 MiB segment, requests per second at
            -c CONNS (one stream at a time per connection), then the time to first byte p50/p99 at a fixed rate
            with latency correction, and the CPU each target's processes spent per 1000 requests
  origin    misses (every request a new 1 KiB URL, wrk with a Lua script) through lacquerd with an HTTP/1.1
            backend, the same lacquerd with an `h2c` backend, and NGINX (HTTP/1.1 keep-alive upstream; 1.22 has
            no HTTP/2 upstream): requests per second, p99, and the most connections to the origin seen open
            at once during the run (ss, sampled every 100 ms)

Binaries: --lacquerd ($LACQUERD), --origin ($BENCH_ORIGIN), else target/release/. oha and wrk from PATH."""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare import (  # noqa: E402
    CONTROL_PORT, ORIGIN_PORT, ROOT, cpu_seconds, nginx_conf, sh, stop, tree, wait_port)
from edge import certificate  # noqa: E402
from hotpath import SCRIPTS, per_round_ratio  # noqa: E402

MANIFEST = "/hls/channel-7/720p.m3u8"
SEGMENT = "/obj/4m"
TLS_PORT = 8441
NGINX_TLS_PORT = 8443
H1_PORT, H2C_PORT, NGINX_PORT = 8981, 8984, 8983
ADMIN = {"h3": 8991, "h1": 8992, "h2c": 8993}


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def wait_tls(port, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if subprocess.run(["curl", "-sk", "-o", "/dev/null", f"https://127.0.0.1:{port}{MANIFEST}"]).returncode == 0:
            return
        time.sleep(0.2)
    raise SystemExit(f"nothing answers TLS on port {port}")


def lacquerd(args, work, name, config, listen_flags=()):
    path = f"{work}/{name}.toml"
    with open(path, "w") as f:
        f.write(config)
    return subprocess.Popen(
        [args.lacquerd, "--config", path, *listen_flags, "--admin", f"127.0.0.1:{ADMIN[name]}",
         "--disk", f"{work}/{name}", "--memory", "256MiB", "--disk-size", "2GiB"],
        env={**os.environ, "RUST_LOG": "warn"})


def lacquer_stats(work, name):
    secret = open(f"{work}/{name}/secret").read().strip()
    req = urllib.request.Request(f"http://127.0.0.1:{ADMIN[name]}/v1/stats",
                                 headers={"authorization": f"Bearer {secret}"})
    return json.loads(urllib.request.urlopen(req, timeout=30).read())


def oha(url, version, extra):
    out = sh(["oha", "--no-tui", "--output-format", "json", "--insecure", "--http-version", version, *extra, url])
    return json.loads(out)


# ------------------------------------------------------------------------------------------------------ h3

def h3(args):
    work = tempfile.mkdtemp(prefix="lacquer-protocols-")
    procs = {}
    cert, key = certificate(work)
    try:
        procs["origin"] = subprocess.Popen([args.origin, str(ORIGIN_PORT), str(CONTROL_PORT)])
        procs["lacquer"] = lacquerd(args, work, "h3", f"""
[[backend]]
address = "127.0.0.1:{ORIGIN_PORT}"
[[listen]]
address = "127.0.0.1:{TLS_PORT}"
tls = [{{ cert = "{cert}", key = "{key}" }}]
quic = true
""")
        nginx_h3 = args.nginx_h3 if os.access(args.nginx_h3, os.X_OK) else None
        listen = (f"listen 127.0.0.1:{NGINX_TLS_PORT} ssl;\n        listen 127.0.0.1:{NGINX_TLS_PORT} quic reuseport;"
                  "\n        http2 on;" if nginx_h3 else f"listen 127.0.0.1:{NGINX_TLS_PORT} ssl http2;")
        conf = nginx_conf(work, f"{listen}\n        ssl_certificate {cert};\n        ssl_certificate_key {key};")
        procs["nginx"] = subprocess.Popen([nginx_h3 or "/usr/sbin/nginx", "-c", conf, "-p", work],
                                          stdout=subprocess.DEVNULL)
        wait_tls(TLS_PORT)
        wait_tls(NGINX_TLS_PORT)
        targets = {
            "lacquer-h3": (f"https://127.0.0.1:{TLS_PORT}", "3", "lacquer"),
            "lacquer-h2": (f"https://127.0.0.1:{TLS_PORT}", "2", "lacquer"),
            "nginx-h2": (f"https://127.0.0.1:{NGINX_TLS_PORT}", "2", "nginx"),
        }
        if nginx_h3:
            targets["nginx-h3"] = (f"https://127.0.0.1:{NGINX_TLS_PORT}", "3", "nginx")
        else:
            log(f"no NGINX with HTTP/3 at {args.nginx_h3} (bench/build-nginx-h3 makes one): NGINX over HTTP/2 only")
        # Warm every cache, and check HTTP/3 answers at all (oha counts errors rather than failing).
        for name, (base, version, _) in list(targets.items()):
            for path in (MANIFEST, SEGMENT):
                data = oha(base + path, version, ["-n", "4", "-c", "1", "-t", "5s"])
                codes = data.get("statusCodeDistribution", {})
                if set(codes) == {"200"}:
                    continue
                failure = f"{name} {path}: {codes} {data.get('errorDistribution')}"
                if name != "nginx-h3":
                    raise SystemExit(failure)
                # Seen with oha 1.16 (quinn + h3) against NGINX 1.26.3 on OpenSSL 3.0's QUIC compatibility
                # layer: its streams are reset (H3_INTERNAL_ERROR) or never answered, where aioquic's are.
                print(f"\nNGINX over HTTP/3 left out: oha cannot fetch from it ({failure})")
                del targets[name]
                break
        names = list(targets)
        raw = {(path, t): {} for path in (MANIFEST, SEGMENT) for t in names}
        for r in range(args.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for path, rate in ((MANIFEST, args.manifest_rate), (SEGMENT, args.segment_rate)):
                for t in order:
                    base, version, proc = targets[t]
                    pid = procs[proc].pid
                    before = cpu_seconds(pid)
                    load = oha(base + path, version, ["-z", f"{args.seconds}s", "-c", str(args.conns)])
                    cpu = cpu_seconds(pid) - before
                    paced = oha(base + path, version, ["-z", f"{args.seconds}s", "-c", str(args.conns),
                                                       "-q", str(rate), "--latency-correction"])
                    out = raw[(path, t)]
                    summary = load["summary"]
                    done = sum(load.get("statusCodeDistribution", {}).values())
                    # A -z run ends with the requests then in flight "aborted due to deadline": not failures.
                    errors = sum(n for run in (load, paced) for kind, n in run.get("errorDistribution", {}).items()
                                 if "deadline" not in kind)
                    out.setdefault("rps", []).append(summary["requestsPerSec"])
                    out.setdefault("cpu", []).append(1000 * cpu / max(done / 1000, 1e-9))
                    out.setdefault("ttfb50", []).append(paced["firstBytePercentiles"]["p50"] * 1000)
                    out.setdefault("ttfb99", []).append(paced["firstBytePercentiles"]["p99"] * 1000)
                    out.setdefault("errors", []).append(errors)
                    if errors:
                        log(f"{t} {path} errors: {load.get('errorDistribution')} {paced.get('errorDistribution')}")
                    log(f"h3 round {r + 1} {path} {t}: {summary['requestsPerSec']:.0f} rps, TTFB p50 "
                        f"{out['ttfb50'][-1]:.2f} p99 {out['ttfb99'][-1]:.2f} ms, {out['cpu'][-1]:.0f} ms CPU "
                        f"per 1000, {errors} errors")
        stats = lacquer_stats(work, "h3")
        edge = stats["proxy"]
        log("lacquerd counters: " + json.dumps({k: v for k, v in edge.items()
                                                if "http3" in k or "quic" in k or k.startswith("requests_http")}))
    finally:
        stop([p for n, p in procs.items() if n != "origin"] + ([procs["origin"]] if "origin" in procs else []),
             work)
    for path, label, rate in ((MANIFEST, "2 KiB manifest", args.manifest_rate),
                              (SEGMENT, "4 MiB segment", args.segment_rate)):
        table = {t: raw[(path, t)] for t in names}
        print(f"\nhits, {label}: oha -c{args.conns} -z{args.seconds}s (rps), then at {rate} rps with latency "
              f"correction (TTFB); median of {args.rounds} rounds; ratios are medians of per-round ratios\n")
        versus = [t for t in names if t != "lacquer-h3"]
        print("| metric | " + " | ".join(names) + " | " + " | ".join(f"lacquer-h3 / {v}" for v in versus) + " |")
        print("|---" * (1 + len(names) + len(versus)) + "|")
        for label_, key, fmt in (("requests/s", "rps", "{:.0f}"), ("TTFB p50 (ms)", "ttfb50", "{:.2f}"),
                                 ("TTFB p99 (ms)", "ttfb99", "{:.2f}"),
                                 ("CPU per 1000 requests (ms)", "cpu", "{:.0f}"), ("errors", "errors", "{:.0f}")):
            cells = [fmt.format(statistics.median(table[t][key])) for t in names]
            ratios = [per_round_ratio(table, key, "lacquer-h3", v) for v in versus]
            print("| " + " | ".join([label_] + cells + ratios) + " |")


# -------------------------------------------------------------------------------------------------- origin

class OriginConnections(threading.Thread):
    """The most TCP connections to the origin's port that the processes `pids` held established at once while it
    runs (every target is up during the run, and the others' idle keep-alive connections are not this one's)."""

    def __init__(self, pids):
        super().__init__(daemon=True)
        self.owners = {f"pid={p}," for p in pids}
        self.most, self.done = 0, threading.Event()

    def run(self):
        while not self.done.is_set():
            out = subprocess.run(["ss", "-Htnp", "state", "established", f"( dport = :{ORIGIN_PORT} )"],
                                 capture_output=True, text=True).stdout
            mine = [line for line in out.splitlines() if any(o in line for o in self.owners)]
            self.most = max(self.most, len(mine))
            time.sleep(0.1)

    def stop(self):
        self.done.set()
        self.join()
        return self.most


def origin(args):
    work = tempfile.mkdtemp(prefix="lacquer-protocols-")
    scripts = f"{work}/scripts"
    os.makedirs(scripts)
    for name, text in SCRIPTS.items():
        with open(f"{scripts}/{name}.lua", "w") as f:
            f.write(text)
    procs = {}
    try:
        procs["origin"] = subprocess.Popen([args.origin, str(ORIGIN_PORT), str(CONTROL_PORT)])
        for name, port, protocol in (("h1", H1_PORT, "http1"), ("h2c", H2C_PORT, "h2c")):
            procs[name] = lacquerd(args, work, name, f"""
[[backend]]
address = "127.0.0.1:{ORIGIN_PORT}"
protocol = "{protocol}"
[[listen]]
address = "127.0.0.1:{port}"
""")
        procs["nginx"] = subprocess.Popen(
            ["/usr/sbin/nginx", "-c", nginx_conf(work, f"listen 127.0.0.1:{NGINX_PORT};"), "-p", work],
            stdout=subprocess.DEVNULL)
        targets = {"lacquer-h2c": (H2C_PORT, "h2c"), "lacquer-h1": (H1_PORT, "h1"), "nginx": (NGINX_PORT, "nginx")}
        for port, _ in targets.values():
            wait_port(port)
        names = list(targets)
        raw = {t: {} for t in names}
        for r in range(args.rounds):
            for t in names[r % len(names):] + names[:r % len(names)]:
                port, proc = targets[t]
                watch = OriginConnections(tree(procs[proc].pid))
                watch.start()
                before = cpu_seconds(procs[proc].pid)
                out = sh(["wrk", "-t1", f"-c{args.miss_conns}", f"-d{args.seconds}s", "-s",
                          f"{scripts}/new-urls.lua", f"http://127.0.0.1:{port}/", "--", f"/new/{t}-{r}-"])
                cpu = cpu_seconds(procs[proc].pid) - before
                most = watch.stop()
                res = json.loads(next(line for line in out.splitlines() if line.startswith("WRKJSON "))[8:])
                rps = res["requests"] / (res["duration_us"] / 1e6)
                errors = sum(res[k] for k in ("connect", "read", "write", "status", "timeout"))
                row = raw[t]
                row.setdefault("rps", []).append(rps)
                row.setdefault("p99", []).append(res["p99_us"] / 1000)
                row.setdefault("conns", []).append(most)
                row.setdefault("cpu", []).append(1000 * cpu / max(res["requests"] / 1000, 1e-9))
                row.setdefault("errors", []).append(errors)
                log(f"origin round {r + 1} {t}: {rps:.0f} rps, p99 {res['p99_us'] / 1000:.2f} ms, "
                    f"{most} origin connections, {row['cpu'][-1]:.0f} ms CPU per 1000, {errors} errors")
    finally:
        stop([p for n, p in procs.items() if n != "origin"] + ([procs["origin"]] if "origin" in procs else []),
             work)
    print(f"\nmisses, every request a new 1 KiB URL: wrk -t1 -c{args.miss_conns} -d{args.seconds}s; median of "
          f"{args.rounds} rounds; ratios are medians of per-round ratios\n")
    print("| metric | lacquerd, h2c backend | lacquerd, HTTP/1.1 backend | NGINX, HTTP/1.1 upstream | h2c / h1 | "
          "h2c / NGINX |")
    print("|---|---|---|---|---|---|")
    for label, key, fmt in (("requests/s", "rps", "{:.0f}"), ("latency p99 (ms, wrk's)", "p99", "{:.2f}"),
                            ("origin connections open at once (most)", "conns", "{:.0f}"),
                            ("CPU per 1000 requests (ms)", "cpu", "{:.0f}"), ("errors", "errors", "{:.0f}")):
        cells = [fmt.format(statistics.median(raw[t][key])) for t in names]
        ratios = [per_round_ratio(raw, key, "lacquer-h2c", v) for v in ("lacquer-h1", "nginx")]
        print("| " + " | ".join([label] + cells + ratios) + " |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=["h3", "origin"], help="one workload (default: both)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=6)
    ap.add_argument("--conns", type=int, default=50, help="h3: oha connections")
    ap.add_argument("--manifest-rate", type=int, default=1000, help="h3: requests per second for the manifest's TTFB")
    ap.add_argument("--segment-rate", type=int, default=40, help="h3: requests per second for the segment's TTFB")
    ap.add_argument("--nginx-h3", default=os.environ.get("NGINX_H3", "/usr/local/sbin/nginx-h3"),
                    help="h3: an NGINX built with HTTP/3 (bench/build-nginx-h3), used for NGINX's HTTP/2 and HTTP/3")
    ap.add_argument("--miss-conns", type=int, default=50, help="origin: wrk connections")
    ap.add_argument("--lacquerd", default=os.environ.get("LACQUERD", f"{ROOT}/target/release/lacquerd"))
    ap.add_argument("--origin", default=os.environ.get("BENCH_ORIGIN", f"{ROOT}/target/release/bench-origin"))
    args = ap.parse_args()
    for tool in ("oha", "wrk", "ss", "curl"):
        if not shutil.which(tool):
            raise SystemExit(f"{tool} is not installed (oha: cargo install oha --locked --features http3)")
    log(f"load average at start: {os.getloadavg()}")
    if args.only in (None, "h3"):
        h3(args)
    if args.only in (None, "origin"):
        origin(args)
    log(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
