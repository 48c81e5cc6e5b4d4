#!/usr/bin/env python3
"""Large objects, lacquerd against NGINX (proxy_cache on disk) in one run, targets alternating:
- time to first byte of a cached 4 MiB object (and of a 2 KiB one, which shows what a new connection
  costs apart from the body): curl time_starttransfer, median of --ttfb-requests per round;
- a 200 MiB object lacquerd holds on its disk tier only (a 64 MiB memory tier, restarted after the fill so
  the memory tier is empty; the admin API's object inspection confirms where the chunks are before every
  read): full reads with curl to /dev/null by 1 client and by --clients at once, MB/s per client, and the
  target's CPU (user + system, its processes) per GiB sent, which the neighbours on a shared machine move
  far less than the rate;
- HLS segments beyond memory: 60 segments of 4 MiB (240 MiB against lacquerd's 64 MiB memory tier, all on
  its disk tier after the restart), asked for at random at --segment-rate (100) requests a second for
  --segment-seconds (10) per round (oha, 10 connections): time to first byte p50 and p99.
Prints the medians over --rounds and the lacquer / nginx ratios. LACQUERD=path runs another lacquerd build."""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import compare  # noqa: E402
from compare import ROOT, cpu_seconds, curl_ttfb, nginx_conf, oha_json, stop, wait_port  # noqa: E402

# Ports of its own (200 below the comparison's), so that it can run beside bench/run or a soak.
ORIGIN_PORT = compare.ORIGIN_PORT = 8780
CONTROL_PORT = 8779
LACQUER, NGINX, ADMIN = 8781, 8783, 8792
BIG = 200 * 1024 * 1024
BIG_PATH = f"/stream/max-age=3600/{BIG}/big"
# bench-origin answers any other path with its 4 MiB body, cacheable for an hour.
SEGMENTS = 60
SEGMENT_REGEX = "/segment/[0-5][0-9].ts"


CONFIG = []


def lacquerd(work):
    return subprocess.Popen(
        [os.environ.get("LACQUERD", f"{ROOT}/target/release/lacquerd")] + CONFIG + ["--listen", f"127.0.0.1:{LACQUER}", "--admin", f"127.0.0.1:{ADMIN}",
         "--backend", f"127.0.0.1:{ORIGIN_PORT}", "--disk", f"{work}/lacquer", "--memory", "64MiB",
         "--disk-size", "1GiB"],
        env={**os.environ, "RUST_LOG": "warn"})


def tiers(work):
    """Chunks of the 200 MiB object held by lacquerd's memory and disk tiers."""
    secret = open(f"{work}/lacquer/secret").read().strip()
    url = f"http://127.0.0.1:{ADMIN}/v1/objects?url={BIG_PATH}&host=127.0.0.1:{LACQUER}"
    req = urllib.request.Request(url, headers={"authorization": f"Bearer {secret}"})
    data = json.loads(urllib.request.urlopen(req).read())
    if not data.get("cached"):
        return None
    return data["variants"][0]["tiers"]


def full_reads(port, clients):
    """MB/s of each of `clients` simultaneous full reads of the 200 MiB object."""
    cmd = ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code} %{size_download} %{speed_download}",
           f"http://127.0.0.1:{port}{BIG_PATH}"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) for _ in range(clients)]
    speeds = []
    for p in procs:
        code, size, speed = p.communicate()[0].split()
        if code != "200" or int(size) != BIG:
            raise SystemExit(f"port {port}: status {code}, {size} bytes")
        speeds.append(float(speed) / 1e6)
    return speeds


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ttfb-requests", type=int, default=30)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--skip-big", action="store_true", help="only the time to first byte")
    ap.add_argument("--segment-rate", type=int, default=100)
    ap.add_argument("--segment-seconds", type=int, default=10)
    ap.add_argument("--config", help="a lacquerd configuration file under the flags (another chunk size, say)")
    args = ap.parse_args()
    if args.config:
        CONFIG.extend(["--config", os.path.abspath(args.config)])

    work = tempfile.mkdtemp(prefix="lacquer-large-")
    procs = [subprocess.Popen([f"{ROOT}/target/release/bench-origin", str(ORIGIN_PORT), str(CONTROL_PORT)])]
    conf = nginx_conf(work, f"listen 127.0.0.1:{NGINX};", "proxy_cache_lock_timeout 30s; proxy_read_timeout 60s;")
    procs.append(subprocess.Popen(["/usr/sbin/nginx", "-c", conf, "-p", work], stdout=subprocess.DEVNULL))
    lq = lacquerd(work)
    raw = {"lacquer": {}, "nginx": {}}
    try:
        for port in [ORIGIN_PORT, NGINX, LACQUER]:
            wait_port(port)
        for port in [NGINX, LACQUER]:
            for path in ["/obj/2k", "/obj/4m"] + ([BIG_PATH] if not args.skip_big else []):
                for _ in range(2):
                    urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=120).read()
            for n in range(SEGMENTS):
                urllib.request.urlopen(f"http://127.0.0.1:{port}/segment/{n:02}.ts", timeout=60).read()
        if not args.skip_big:
            # Restarted, lacquerd's memory tier is empty: the 200 MiB body is on the disk tier only.
            time.sleep(2)
            lq.terminate()
            lq.wait(timeout=60)
            lq = lacquerd(work)
            wait_port(LACQUER)
        for r in range(args.rounds):
            order = [("lacquer", LACQUER), ("nginx", NGINX)]
            if r % 2:
                order.reverse()
            for target, port in order:
                res = raw[target]
                res.setdefault("ttfb_2k", []).append(curl_ttfb(port, "/obj/2k", args.ttfb_requests)[0])
                res.setdefault("ttfb_4m", []).append(curl_ttfb(port, "/obj/4m", args.ttfb_requests)[0])
                seg = oha_json(["-z", f"{args.segment_seconds}s", "-q", str(args.segment_rate),
                                "--latency-correction", "-c", "10", "--rand-regex-url",
                                f"http://127.0.0.1:{port}{SEGMENT_REGEX}"])
                codes = seg["statusCodeDistribution"]
                # oha cuts the requests in flight when its time is up: not the target's error.
                errors = {e: k for e, k in seg["errorDistribution"].items() if "deadline" not in e}
                if set(codes) - {"200"} or errors:
                    raise SystemExit(f"{target} segments: {codes} {errors}")
                res.setdefault("seg_p50", []).append(seg["firstBytePercentiles"]["p50"] * 1000)
                res.setdefault("seg_p99", []).append(seg["firstBytePercentiles"]["p99"] * 1000)
                if args.skip_big:
                    continue
                if target == "lacquer":
                    t = tiers(work)
                    res.setdefault("tiers", []).append(t)
                    if t is None:
                        raise SystemExit("the 200 MiB object is no longer cached")
                pid = (lq if target == "lacquer" else procs[1]).pid
                for clients in sorted({1, args.clients}):
                    cpu = cpu_seconds(pid)
                    res.setdefault(f"big_{clients}", []).extend(full_reads(port, clients))
                    gib = clients * BIG / (1 << 30)
                    res.setdefault(f"cpu_{clients}", []).append((cpu_seconds(pid) - cpu) * 1000 / gib)
                print(f"round {r + 1} {target}: " + ", ".join(
                    f"{k} {v[-1]}" for k, v in res.items()), file=sys.stderr)
    finally:
        stop([lq] + procs, work)

    keys = [("ttfb_2k", "2 KiB TTFB p50 (ms)", "{:.3f}"), ("ttfb_4m", "4 MiB TTFB p50 (ms)", "{:.3f}"),
            ("seg_p50", f"4 MiB segments beyond memory at {args.segment_rate} rps: TTFB p50 (ms)", "{:.3f}"),
            ("seg_p99", "the same: TTFB p99 (ms)", "{:.3f}")]
    if not args.skip_big:
        keys += [("big_1", "200 MiB from disk, 1 client (MB/s)", "{:.0f}"),
                 (f"big_{args.clients}", f"200 MiB from disk, {args.clients} clients (MB/s per client)", "{:.0f}"),
                 ("cpu_1", "the same, 1 client: CPU ms per GiB sent", "{:.0f}"),
                 (f"cpu_{args.clients}", f"the same, {args.clients} clients: CPU ms per GiB sent", "{:.0f}")]
    print(f"\nmedian of {args.rounds} rounds; load: {os.getloadavg()}\n")
    print("| metric | lacquer | nginx | lacquer / nginx |")
    print("|---|---|---|---|")
    for key, label, fmt in keys:
        lq_m, ng_m = statistics.median(raw["lacquer"][key]), statistics.median(raw["nginx"][key])
        print(f"| {label} | {fmt.format(lq_m)} | {fmt.format(ng_m)} | {lq_m / ng_m:.2f} |")
    if raw["lacquer"].get("tiers"):
        print(f"\nlacquer's 200 MiB object before each read: {raw['lacquer']['tiers']}")


if __name__ == "__main__":
    main()
