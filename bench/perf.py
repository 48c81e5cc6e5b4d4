#!/usr/bin/env python3
"""Issue 17's performance targets, lacquerd against NGINX (proxy_cache on disk) and Varnish (-s malloc) in front
of one origin, side by side in the same run. Workloads (select with --only, size with the flags below):

  ceiling   hit throughput (wrk -t2 -c100, 2 KiB) and p50/p99 at a fixed rate, with a bare hyper server
            (bench/ceiling) as the ceiling; optional perf profile of lacquerd under wrk (--profile)
  longtail  uniform random reads over N objects of 1 KiB with a 64 MiB memory tier: latency and the share
            served without the origin
  stream    a 200 MiB object from lacquerd's disk tier, 1 and 4 clients at once; 4 MiB TTFB, and the TTFB p99
            of a 64 KiB range of it at 500 rps (oha)
  restart   lacquerd alone: N objects of 1 KiB on disk, SIGTERM, start again: time to the first hit, to the
            whole catalogue counted, RSS and metadata bytes per object; then kill -9 and start again: time to
            the first hit (NGINX's cache loader beside it with --restart-nginx)
  scan      hot-set protection: hit ratio of a steadily read hot set while a one-time scan of a catalogue
            larger than the memory tier runs

Rounds interleave the targets and rotate their order; tables show medians and ratios (lacquer / other).
Objects are named with zero-padded numbers so that oha's --rand-regex-url draws them uniformly: every
object count must be one digit followed by zeros (2000, 100000, 1000000).

The binaries come from --lacquerd, --origin and --ceiling, whose defaults are $LACQUERD, $BENCH_ORIGIN and
$BENCH_CEILING, else lacquerd, bench-origin and bench-ceiling in $BENCH_BIN, else in target/release (what
bench/run builds)."""

import argparse
import http.client
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare import (  # noqa: E402
    CONTROL_PORT, ORIGIN_PORT, ROOT, TARGETS, curl_ttfb, nginx_conf, oha_json, oha_latency, range_ttfb_p99, sh,
    stop, wait_port, wrk_rps)

CEILING_PORT = 8984
ADMIN_PORT = 8991
MiB = 1024 * 1024
WORKLOADS = ["ceiling", "longtail", "stream", "restart", "scan"]
# Work directories being removed in the background (Stack.close with args.detach_cleanup).
CLEANUPS = []


def binary(name, env):
    """The default path of one of the benchmark's binaries: $`env`, else `name` in $BENCH_BIN, else the release
    build bench/run makes."""
    return os.environ.get(env) or os.path.join(os.environ.get("BENCH_BIN") or f"{ROOT}/target/release", name)


def binary_flags(ap):
    """--lacquerd, --origin and --ceiling, for every script that starts the stack."""
    ap.add_argument("--lacquerd", default=binary("lacquerd", "LACQUERD"),
                    help="the lacquerd binary to measure (default: $LACQUERD, $BENCH_BIN/lacquerd, target/release)")
    ap.add_argument("--origin", default=binary("bench-origin", "BENCH_ORIGIN"),
                    help="bench-origin (default: $BENCH_ORIGIN, $BENCH_BIN/bench-origin, target/release)")
    ap.add_argument("--ceiling", default=binary("bench-ceiling", "BENCH_CEILING"),
                    help="bench-ceiling (default: $BENCH_CEILING, $BENCH_BIN/bench-ceiling, target/release)")


def check_binaries(args, names):
    for name in names:
        path = getattr(args, name)
        if not os.access(path, os.X_OK):
            raise SystemExit(f"--{name} {path}: not an executable (bench/run builds it, or set $BENCH_BIN)")


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def get(port, path):
    """(status, headers with lower-case names) of one GET on a fresh connection, the body read."""
    con = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        con.request("GET", path)
        resp = con.getresponse()
        resp.read()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}
    finally:
        con.close()


def origin_count(path=None):
    """Requests the origin served: all of them, or those for `path`."""
    url = f"/__count{path}" if path else "/__total"
    return int(urllib.request.urlopen(f"http://127.0.0.1:{ORIGIN_PORT}{url}").read())


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def idle_rss_kib(pid, settle=1.0):
    """RSS once two readings `settle` apart agree within 1 %."""
    last = rss_kib(pid)
    for _ in range(30):
        time.sleep(settle)
        now = rss_kib(pid)
        if abs(now - last) <= last / 100:
            return now
        last = now
    return last


def du_bytes(path):
    """Bytes allocated on disk (preallocated files count for what they occupy, not their length)."""
    return int(sh(["du", "-sB1", path]).split()[0])


def names(count):
    """(curl glob, oha regex, width) for the objects 0 .. count-1, zero-padded to `width` digits so that the
    regex draws every one with the same probability. `count` must be one digit followed by zeros."""
    digits = str(count)
    if digits[0] == "0" or digits[1:].strip("0"):
        raise SystemExit(f"object count {count}: must be one digit followed by zeros (e.g. 2000, 100000)")
    zeros, lead = len(digits) - 1, int(digits[0])
    width = len(str(count - 1))
    glob = f"[{'0' * width}-{count - 1}]"
    tail = f"[0-9]{{{zeros}}}" if zeros else ""
    regex = tail if lead == 1 else f"[0-{lead - 1}]{tail}"
    return glob, regex, width


def fill(port, prefix, count, parallel=32):
    """GETs prefix + every name once, `parallel` at a time (curl's URL globbing); returns seconds taken."""
    glob, _, _ = names(count)
    started = time.time()
    subprocess.run(["curl", "-s", "--no-progress-meter", "-Z", "--parallel-max", str(parallel),
                    f"http://127.0.0.1:{port}{prefix}{glob}"], check=True, stdout=subprocess.DEVNULL)
    return time.time() - started


def rotate(names_, r):
    return names_[r % len(names_):] + names_[:r % len(names_)]


def ratio(a, b):
    return f"{a / b:.2f}" if b else "-"


def table(title, targets, rows, med, versus):
    """A Markdown table: `rows` are (label, key, format); a ratio column lacquer / v for each v in `versus`."""
    print(f"\n{title}\n")
    print("| metric | " + " | ".join(targets) + " | " + " | ".join(f"lacquer / {v}" for v in versus) + " |")
    print("|---" * (1 + len(targets) + len(versus)) + "|")
    for label, key, fmt in rows:
        cells = [fmt.format(med[t][key]) if key in med[t] else "-" for t in targets]
        ratios = [ratio(med["lacquer"][key], med[v][key]) if key in med[v] else "-" for v in versus]
        print(f"| {label} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |", flush=True)


def medians(raw):
    return {t: {k: statistics.median(v) for k, v in r.items() if isinstance(v, list) and v} for t, r in raw.items()}


class Stack:
    """The origin and the targets a workload asks for, each with the workload's sizes, in one work directory."""

    def __init__(self, args):
        self.args = args
        self.work = tempfile.mkdtemp(prefix="lacquer-perf-", dir=args.workdir)
        self.procs = {}
        self.lacquer_flags = None
        self.procs["origin"] = subprocess.Popen([args.origin, str(ORIGIN_PORT), str(CONTROL_PORT)])
        wait_port(ORIGIN_PORT)

    def lacquer(self, memory="256MiB", disk_size="2GiB", fresh=True):
        """Starts lacquerd (the binary given by --lacquerd) with its store in the work directory."""
        if fresh:
            shutil.rmtree(f"{self.work}/lacquer", ignore_errors=True)
        self.lacquer_flags = (memory, disk_size)
        cmd = [self.args.lacquerd, "--listen", f"127.0.0.1:{TARGETS['lacquer']}",
               "--admin", f"127.0.0.1:{ADMIN_PORT}", "--backend", f"127.0.0.1:{ORIGIN_PORT}",
               "--disk", f"{self.work}/lacquer", "--memory", memory, "--disk-size", disk_size]
        started = time.time()
        self.procs["lacquer"] = subprocess.Popen(cmd, env={**os.environ, "RUST_LOG": "warn"})
        return started

    def lacquer_admin(self, path):
        secret = open(f"{self.work}/lacquer/secret").read().strip()
        req = urllib.request.Request(f"http://127.0.0.1:{ADMIN_PORT}{path}",
                                     headers={"authorization": f"Bearer {secret}"})
        return json.loads(urllib.request.urlopen(req, timeout=30).read())

    def lacquer_stats(self):
        return self.lacquer_admin("/v1/stats")

    def lacquer_settle(self):
        """Waits until everything lacquerd published is durable on disk."""
        while True:
            store = self.lacquer_stats()["store"]
            if store["objects_durable"] >= store["objects_published"]:
                return
            time.sleep(0.2)

    def stop_one(self, name):
        """SIGTERM to one target, and waits for it; returns the seconds it took to exit."""
        p = self.procs.pop(name)
        started = time.time()
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        return time.time() - started

    def varnish(self, storage="malloc,256m"):
        vcl = f"{self.work}/bench.vcl"
        with open(vcl, "w") as f:
            f.write(f'vcl 4.1;\nbackend origin {{ .host = "127.0.0.1"; .port = "{ORIGIN_PORT}"; }}\n')
        self.procs["varnish"] = subprocess.Popen(
            ["/usr/sbin/varnishd", "-F", "-j", "none", "-n", f"{self.work}/varnish",
             "-a", f"127.0.0.1:{TARGETS['varnish']}", "-f", vcl, "-s", storage, "-T", "127.0.0.1:8992"],
            stdout=subprocess.DEVNULL)

    def nginx(self, keys_zone_mib=64, max_size="8g"):
        """NGINX as compare.py runs it, with the keys zone sized for the catalogue and X-Cache-Status; and
        ranges served from the cache although bench-origin sends no Accept-Ranges (without proxy_force_ranges
        NGINX answers a range with the whole body)."""
        conf = nginx_conf(self.work, f"listen 127.0.0.1:{TARGETS['nginx']};",
                          "add_header X-Cache-Status $upstream_cache_status;\n            proxy_force_ranges on;")
        text = open(conf).read().replace("keys_zone=bench:64m max_size=2g",
                                         f"keys_zone=bench:{keys_zone_mib}m max_size={max_size}")
        open(conf, "w").write(text)
        self.procs["nginx"] = subprocess.Popen(["/usr/sbin/nginx", "-c", conf, "-p", self.work],
                                               stdout=subprocess.DEVNULL)

    def ceiling(self):
        self.procs["ceiling"] = subprocess.Popen([self.args.ceiling, str(CEILING_PORT)])

    def port(self, name):
        return CEILING_PORT if name == "ceiling" else TARGETS[name]

    def ready(self):
        for name in self.procs:
            if name != "origin":
                wait_port(self.port(name))

    def close(self):
        """Stops everything; removes the work directory, or with `args.detach_cleanup` has `rm` remove it
        while the next measurement runs: on this machine's ext4 (mounted with discard) unlinking NGINX's cache
        of 100 000 files takes about two minutes. wait_cleanups() waits for them."""
        detach = getattr(self.args, "detach_cleanup", False)
        stop([p for _, p in sorted(self.procs.items(), key=lambda kv: kv[0] == "origin")], self.work,
             remove=not detach)
        if detach:
            CLEANUPS.append(subprocess.Popen(["rm", "-rf", self.work]))


def wait_cleanups():
    """Waits for the work directories Stack.close left to `rm`; returns the seconds waited."""
    started = time.time()
    while CLEANUPS:
        CLEANUPS.pop().wait()
    return time.time() - started


def hit(name, headers):
    """Whether a response was served from the cache, by each target's own marker."""
    if name == "lacquer":
        return headers.get("x-cache") == "HIT"
    if name == "varnish":
        return len(headers.get("x-varnish", "").split()) == 2
    return headers.get("x-cache-status") == "HIT"


# ---------------------------------------------------------------------------------------------- ceiling

def profile(stack, seconds, out):
    """perf record of lacquerd (call graphs) while wrk loads it; the top symbols (self time) go to `out`."""
    if not shutil.which("perf"):
        log("perf is not installed (apt-get install linux-perf): no profile")
        return
    data = f"{stack.work}/perf.data"
    pid = stack.procs["lacquer"].pid
    # DWARF call graphs: the release build has debug info but no frame pointers.
    rec = subprocess.Popen(["perf", "record", "-F", "499", "--call-graph", "dwarf,16384", "-p", str(pid),
                            "-o", data, "--", "sleep", str(seconds)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wrk_rps(TARGETS["lacquer"], seconds)
    rec.wait()
    report = ["perf", "report", "-i", data, "--stdio"]
    with open(out, "w") as f:
        # Self time by symbol and by shared object: where the cycles are spent.
        f.write(sh(report + ["--no-children", "--sort", "symbol", "-g", "none", "--percent-limit", "0.5"]))
        f.write(sh(report + ["--no-children", "--sort", "dso", "-g", "none"]))
        # Time including callees, by function: which parts of the hit path cost what.
        f.write(sh(report + ["--children", "--sort", "symbol", "-g", "none", "--percent-limit", "2"]))
        # Who copies: the callers of memmove/memcpy.
        f.write(sh(report + ["--no-children", "--sort", "symbol", "-g", "graph,0.5,callee,function,percent",
                             "--symbol-filter", "mem", "--percent-limit", "1"]))
    log(f"perf profile of lacquerd under wrk: {out}")


def ceiling(args):
    stack = Stack(args)
    try:
        stack.lacquer()
        stack.varnish()
        stack.nginx()
        stack.ceiling()
        stack.ready()
        targets = ["lacquer", "nginx", "varnish", "ceiling"]
        for t in targets:
            for _ in range(3):
                get(stack.port(t), "/obj/2k")
        raw = {t: {} for t in targets}
        for r in range(args.rounds):
            for t in rotate(targets, r):
                port = stack.port(t)
                raw[t].setdefault("rps", []).append(wrk_rps(port, args.seconds))
                p50, p99 = oha_latency(port, args.seconds, args.rate)
                raw[t].setdefault("p50", []).append(p50)
                raw[t].setdefault("p99", []).append(p99)
                log(f"ceiling round {r + 1} {t}: {raw[t]['rps'][-1]:.0f} rps, p50 {p50:.2f} p99 {p99:.2f} ms")
        if args.profile:
            profile(stack, args.seconds, args.profile)
    finally:
        stack.close()
    med = medians(raw)
    table(f"hit path, cached 2 KiB object, median of {args.rounds} rounds", targets, [
        ("max rps (wrk -t2 -c100)", "rps", "{:.0f}"),
        (f"p50 at {args.rate} rps, oha -c 50 (ms)", "p50", "{:.2f}"),
        (f"p99 at {args.rate} rps, oha -c 50 (ms)", "p99", "{:.2f}"),
    ], med, ["nginx", "varnish", "ceiling"])


# --------------------------------------------------------------------------------------------- longtail

def longtail(args):
    n = args.objects or 100_000
    _, regex, _ = names(n)
    prefix = "/small/lt/"
    stack = Stack(args)
    targets = args.longtail_targets.split(",")
    try:
        stack.lacquer(memory="64MiB", disk_size=f"{max(2, n * 8 // MiB + 1)}GiB")
        if "varnish" in targets:
            stack.varnish("malloc,64m")
        # NGINX's docs: one megabyte of keys zone holds about 8000 keys.
        stack.nginx(keys_zone_mib=n // 8000 + 16)
        stack.ready()
        fills = {}
        for t in targets:
            before = origin_count()
            secs = fill(stack.port(t), prefix, n)
            first = origin_count() - before
            # A second pass: whatever the first did not keep is fetched again, and shows as refetches.
            before = origin_count()
            fill(stack.port(t), prefix, n)
            fills[t] = (secs, first, origin_count() - before)
            if t == "lacquer":
                stack.lacquer_settle()
            log(f"longtail fill {t}: {n} objects in {secs:.1f} s, {first} fetches, {fills[t][2]} on the second pass")
        raw = {t: {} for t in targets}
        for r in range(args.rounds):
            for t in rotate(targets, r):
                before = origin_count()
                data = oha_json(["-z", f"{args.longtail_seconds}s", "-q", str(args.longtail_rate),
                                 "--latency-correction", "-c", "50", "--rand-regex-url",
                                 f"http://127.0.0.1:{stack.port(t)}{prefix}{regex}"])
                fetched = origin_count() - before
                codes = data["statusCodeDistribution"]
                answered = sum(codes.values())
                errors = {e: k for e, k in data["errorDistribution"].items() if "deadline" not in e}
                if errors or set(codes) - {"200"}:
                    log(f"longtail {t}: statuses {codes}, errors {errors}")
                res = raw[t]
                res.setdefault("p50", []).append(data["latencyPercentiles"]["p50"] * 1000)
                res.setdefault("p99", []).append(data["latencyPercentiles"]["p99"] * 1000)
                res.setdefault("cached", []).append(100 * (1 - fetched / max(answered, 1)))
                res.setdefault("fetched", []).append(fetched)
                log(f"longtail round {r + 1} {t}: p50 {res['p50'][-1]:.2f} p99 {res['p99'][-1]:.2f} ms, "
                    f"{answered} answers, {fetched} origin fetches")
        if args.longtail_profile:
            # One more run of lacquerd's, not counted: where a cold hit's CPU goes.
            import cpu  # noqa: E402 (cpu.py imports this module)
            os.makedirs(args.longtail_profile, exist_ok=True)
            port = stack.port("lacquer")
            cpu.profile(stack.work, stack.procs["lacquer"].pid, args.longtail_profile, f"longtail-{n}",
                        f"lacquerd, long tail: {n} objects of 1 KiB, uniform random reads at "
                        f"{args.longtail_rate} rps, 64 MiB memory tier",
                        lambda: oha_json(["-z", f"{args.longtail_seconds}s", "-q", str(args.longtail_rate),
                                          "--latency-correction", "-c", "50", "--rand-regex-url",
                                          f"http://127.0.0.1:{port}{prefix}{regex}"]),
                        args.longtail_seconds)
        stats = stack.lacquer_stats()
    finally:
        stack.close()
    med = medians(raw)
    for t in targets:
        med[t]["fill_s"], med[t]["fill_fetches"], med[t]["refetched"] = fills[t]
    table(f"long tail: {n} objects of 1 KiB, uniform random reads at {args.longtail_rate} rps for "
          f"{args.longtail_seconds} s, memory 64 MiB (lacquerd, Varnish); median of {args.rounds} rounds",
          targets, [
              ("latency p50 (ms)", "p50", "{:.2f}"),
              ("latency p99 (ms)", "p99", "{:.2f}"),
              ("served without the origin (%)", "cached", "{:.2f}"),
              ("origin fetches in the window", "fetched", "{:.0f}"),
              ("fill, first pass (s)", "fill_s", "{:.1f}"),
              ("origin fetches, second fill pass", "refetched", "{:.0f}"),
          ], med, [t for t in targets if t != "lacquer"])
    p = stats["proxy"]
    print(f"\nlacquerd hits over the run: {p['hits_memory']} from memory, {p['hits_disk']} from disk")


# ----------------------------------------------------------------------------------------------- stream

def timed_reads(port, path, clients):
    """`clients` full reads of `path` at once, each on its own connection: (aggregate MB/s, bytes each)."""
    started = time.time()
    procs = [subprocess.Popen(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code} %{size_download}",
                               f"http://127.0.0.1:{port}{path}"], stdout=subprocess.PIPE, text=True)
             for _ in range(clients)]
    outs = [p.communicate()[0].split() for p in procs]
    elapsed = time.time() - started
    sizes = [int(size) for code, size in outs if code == "200"]
    if len(sizes) != clients:
        log(f"stream {port}: answers {outs}")
    return sum(sizes) / elapsed / 1e6, sizes


def in_memory_chunks(stack, path):
    query = urllib.parse.urlencode({"url": path, "host": f"127.0.0.1:{TARGETS['lacquer']}"})
    variants = stack.lacquer_admin(f"/v1/objects?{query}")["variants"]
    tiers = variants[0]["tiers"] if variants else {"chunks": 0, "in_memory": 0, "on_disk": 0}
    return tiers


def from_disk(stack, path):
    """Restarts lacquerd when a read has put chunks of `path` in its memory tier, so the next read comes from
    disk; returns the chunks still in memory (0 expected)."""
    if in_memory_chunks(stack, path)["in_memory"]:
        stack.stop_one("lacquer")
        stack.lacquer(*stack.lacquer_flags, fresh=False)
        wait_port(TARGETS["lacquer"])
    return in_memory_chunks(stack, path)["in_memory"]


def stream(args):
    size = args.stream_mib * MiB
    path = f"/stream/max-age=3600/{size}/big"
    stack = Stack(args)
    targets = ["lacquer", "nginx", "varnish"]
    try:
        stack.lacquer(memory="64MiB", disk_size="4GiB")
        stack.varnish(f"malloc,{args.stream_mib * 2 + 64}m")
        stack.nginx()
        stack.ready()
        for t in targets:
            timed_reads(stack.port(t), path, 1)
            get(stack.port(t), "/obj/4m")
        stack.lacquer_settle()
        # A restart leaves the memory tier empty: every chunk of the big body is then read from disk.
        stack.stop_one("lacquer")
        stack.lacquer(memory="64MiB", disk_size="4GiB", fresh=False)
        wait_port(TARGETS["lacquer"])
        log(f"stream: lacquerd's tiers for the big object after a restart: {in_memory_chunks(stack, path)}")
        fetches = origin_count(path)
        raw = {t: {} for t in targets}
        range_status = {}
        for clients, key in [(1, "one"), (4, "four")]:
            for r in range(args.stream_reads):
                for t in rotate(targets, r):
                    if t == "lacquer":
                        raw[t].setdefault(f"mem_chunks_{key}", []).append(from_disk(stack, path))
                    speed, _ = timed_reads(stack.port(t), path, clients)
                    raw[t].setdefault(key, []).append(speed)
        for r in range(args.rounds):
            for t in rotate(targets, r):
                ttfb, status = curl_ttfb(stack.port(t), "/obj/4m", 30)
                raw[t].setdefault("ttfb", []).append(ttfb)
                if shutil.which("oha"):
                    raw[t].setdefault("range_p99", []).append(range_ttfb_p99(stack.port(t), args.range_seconds, 500))
                    range_status[t] = curl_ttfb(stack.port(t), "/obj/4m", 1, "1048576-1114111")[1]
        refetched = origin_count(path) - fetches
        stats = stack.lacquer_stats()
    finally:
        stack.close()
    med = medians(raw)
    table(f"large objects: {args.stream_mib} MiB from lacquerd's disk tier (memory tier 64 MiB, restarted "
          f"whenever chunks were in memory before a read), NGINX's disk cache, Varnish's memory; median of "
          f"{args.stream_reads} full reads (curl to /dev/null), 4 MiB TTFB median of {args.rounds} x 30", targets, [
              ("1 client (MB/s)", "one", "{:.0f}"),
              ("4 clients at once, aggregate (MB/s)", "four", "{:.0f}"),
              ("4 MiB hit TTFB p50 (ms)", "ttfb", "{:.2f}"),
              ("64 KiB range of the 4 MiB hit, TTFB p99 at 500 rps (oha, ms)", "range_p99", "{:.2f}"),
          ], med, ["nginx", "varnish"])
    s = stats["store"]
    mem = raw["lacquer"]["mem_chunks_one"] + raw["lacquer"]["mem_chunks_four"]
    print(f"\nlacquerd: chunks of the big object in memory before each read: {mem}; "
          f"chunk reads over the run: {s['chunk_reads_memory']} memory, {s['chunk_reads_disk']} disk; "
          f"origin fetches of the big object during the reads: {refetched}")
    if range_status:
        print("64 KiB range answered with: " + ", ".join(f"{t} {s}" for t, s in range_status.items()))


# ---------------------------------------------------------------------------------------------- restart

def first_hit(port, probes, started, name, timeout=600):
    """Polls stored URLs in a tight loop from `started` (the exec) until one answers as a hit: (seconds to the
    first answer, seconds to the first hit, misses before it). A miss refetches and stores its URL, so a later
    hit on it would prove nothing: after a miss the loop moves on to the next probe."""
    first_answer, misses = None, 0
    while time.time() - started < timeout and misses < len(probes):
        try:
            _, headers = get(port, probes[misses])
        except OSError:
            time.sleep(0.001)
            continue
        if first_answer is None:
            first_answer = time.time() - started
        if hit(name, headers):
            return first_answer, time.time() - started, misses
        misses += 1
    raise SystemExit(f"restart: no hit from {name} within {timeout} s or {len(probes)} stored URLs")


def restart(args):
    n = args.objects or 1_000_000
    prefix = "/small/rs/"
    width = names(n)[2]
    # Stored URLs spread over the catalogue, in an order unrelated to the fill's.
    probes = [f"{prefix}{str(i).zfill(width)}" for i in random.Random(17).sample(range(n), min(n, 1000))]
    stack = Stack(args)
    rows = []
    try:
        disk_size = f"{max(2, n * 8 // MiB + 1)}GiB"
        # The same configuration with nothing stored, for the RSS baseline.
        stack.lacquer(memory="64MiB", disk_size=disk_size)
        wait_port(TARGETS["lacquer"])
        empty_rss = idle_rss_kib(stack.procs["lacquer"].pid)
        stack.stop_one("lacquer")
        stack.lacquer(memory="64MiB", disk_size=disk_size)
        wait_port(TARGETS["lacquer"])
        secs = fill(TARGETS["lacquer"], prefix, n)
        stack.lacquer_settle()
        log(f"restart: filled {n} objects in {secs:.1f} s")
        filled_rss = idle_rss_kib(stack.procs["lacquer"].pid)
        stop_s = stack.stop_one("lacquer")
        before = origin_count()
        started = stack.lacquer(memory="64MiB", disk_size=disk_size, fresh=False)
        answer_s, hit_s, misses = first_hit(TARGETS["lacquer"], probes, started, "lacquer")
        counted, counted_s = 0, None
        while time.time() - started < 600:
            try:
                counted = stack.lacquer_stats()["store"]["objects"]
            except OSError:
                pass
            if counted >= n:
                counted_s = f"{time.time() - started:.2f}"
                break
            time.sleep(0.05)
        rss = idle_rss_kib(stack.procs["lacquer"].pid)
        refetched = origin_count() - before
        # Killed: no clean-close note, so the start replays the invalidation journal over every record.
        killed = stack.procs.pop("lacquer")
        killed.kill()
        killed.wait()
        started = stack.lacquer(memory="64MiB", disk_size=disk_size, fresh=False)
        # Probes the first restart did not refetch.
        answer9_s, hit9_s, misses9 = first_hit(TARGETS["lacquer"], probes[::-1], started, "lacquer")
        # The replay's walk over every record, in the background once the listener is open.
        replayed_s = None
        while time.time() - started < 600:
            try:
                store_stats = stack.lacquer_stats()["store"]
            except OSError:
                store_stats = {}
            if store_stats.get("journal_replayed") == 1:
                replayed_s = f"{time.time() - started:.2f}"
                counted9 = store_stats["objects"]
                break
            time.sleep(0.05)
        store = f"{stack.work}/lacquer"
        # `meta` is sled's directory, `bodies` foyer's.
        dirs = sorted(d for d in os.listdir(store) if os.path.isdir(f"{store}/{d}"))
        rows += [
            ("fill (s)", f"{secs:.1f}"),
            ("SIGTERM to exit (s)", f"{stop_s:.2f}"),
            ("exec to first answer (s)", f"{answer_s:.3f}"),
            ("exec to first hit (s)", f"{hit_s:.3f}"),
            ("misses before the first hit (each on another URL)", f"{misses}"),
            ("exec to every object counted in /v1/stats (s)", counted_s or f"not within 600 s ({counted})"),
            ("after kill -9: exec to first answer (s)", f"{answer9_s:.3f}"),
            ("after kill -9: exec to first hit (s)", f"{hit9_s:.3f}"),
            ("after kill -9: misses before the first hit", f"{misses9}"),
            ("after kill -9: exec to the replay's walk done, every object counted (s)",
             f"{replayed_s} ({counted9} objects)" if replayed_s else "not within 600 s"),
            ("origin fetches during the restart", f"{refetched}"),
            ("RSS, empty store, idle (MiB)", f"{empty_rss / 1024:.1f}"),
            ("RSS, filled, before the restart, idle (MiB)", f"{filled_rss / 1024:.1f}"),
            ("RSS after the restart, idle (MiB)", f"{rss / 1024:.1f}"),
            ("RSS per object after the restart, less the empty store's (B)", f"{(rss - empty_rss) * 1024 / n:.0f}"),
        ] + [(f"store directory `{d}`, allocated, per object (B)", f"{du_bytes(f'{store}/{d}') / n:.0f}")
             for d in dirs]
        if args.restart_nginx:
            stack.nginx(keys_zone_mib=n // 8000 + 16)
            wait_port(TARGETS["nginx"])
            secs = fill(TARGETS["nginx"], prefix, n)
            stack.stop_one("nginx")
            started = time.time()
            stack.nginx(keys_zone_mib=n // 8000 + 16)
            answer_s, hit_s, misses = first_hit(TARGETS["nginx"], probes, started, "nginx")
            rows += [
                ("NGINX: fill (s)", f"{secs:.1f}"),
                ("NGINX: exec to first answer (s)", f"{answer_s:.3f}"),
                ("NGINX: exec to first hit (s)", f"{hit_s:.3f}"),
                ("NGINX: misses before it (each on another URL)", f"{misses}"),
            ]
    finally:
        stack.close()
    print(f"\nrestart: lacquerd with {n} objects of 1 KiB on disk, memory tier 64 MiB, disk tier {disk_size}; "
          f"first hit: polling {len(probes)} stored URLs; NGINX's keys zone holds about 8000 keys per MiB "
          "(~128 B per object, its docs)\n")
    print("| measure | value |\n|---|---|")
    for label, value in rows:
        print(f"| {label} | {value} |")


# ------------------------------------------------------------------------------------------------- scan

class HotLoad(threading.Thread):
    """Reads the hot set at a steady rate from a few keep-alive connections until stopped, counting answers
    and the target's own hit marker per request."""

    def __init__(self, name, port, paths, rate, conns=4):
        super().__init__()
        self.name_, self.port, self.paths, self.conns = name, port, paths, conns
        self.interval = conns / rate
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.answers = self.hits = self.errors = 0

    def worker(self, k):
        rng = random.Random(k)
        con = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        due = time.time()
        while not self.stopping.is_set():
            due += self.interval
            path = rng.choice(self.paths)
            try:
                con.request("GET", path)
                resp = con.getresponse()
                resp.read()
                ok, is_hit = resp.status == 200, hit(self.name_, {k.lower(): v for k, v in resp.getheaders()})
            except (OSError, http.client.HTTPException):
                con.close()
                con = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
                ok, is_hit = False, False
            with self.lock:
                self.answers += ok
                self.errors += not ok
                self.hits += is_hit
            pause = due - time.time()
            if pause > 0:
                time.sleep(pause)
        con.close()

    def run(self):
        workers = [threading.Thread(target=self.worker, args=(k,)) for k in range(self.conns)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()

    def snapshot(self):
        with self.lock:
            return self.answers, self.hits, self.errors


def hot_fetches(paths):
    return sum(origin_count(p) for p in paths)


def scan(args):
    hot_n, scan_n, size = args.hot_objects, args.scan_objects, args.scan_kib * 1024
    width = names(hot_n)[2]
    hot_prefix, scan_prefix = f"/sized/{size}/hot/", f"/sized/{size}/scan/"
    hot_paths = [f"{hot_prefix}{str(i).zfill(width)}" for i in range(hot_n)]
    targets = ["lacquer", "nginx", "varnish"]
    raw = {t: {} for t in targets}
    for r in range(args.rounds):
        stack = Stack(args)
        try:
            stack.lacquer(memory="64MiB", disk_size="4GiB")
            stack.varnish("malloc,64m")
            stack.nginx()
            stack.ready()
            for t in rotate(targets, r):
                port = stack.port(t)
                # The hot set is read three times before the scan, as a hot set is: often.
                for _ in range(3):
                    fill(port, hot_prefix, hot_n, parallel=8)
                if t == "lacquer":
                    stack.lacquer_settle()
                    stats0 = stack.lacquer_stats()["proxy"]
                load = HotLoad(t, port, hot_paths, args.hot_rate)
                f0 = hot_fetches(hot_paths)
                load.start()
                time.sleep(2)
                f1 = hot_fetches(hot_paths)
                a0, h0, _ = load.snapshot()
                scan_s = fill(port, f"{scan_prefix}{r}-{t}/", scan_n, parallel=8)
                a1, h1, e1 = load.snapshot()
                load.stopping.set()
                load.join()
                f2 = hot_fetches(hot_paths)
                during = a1 - a0
                res = raw[t]
                res.setdefault("before", []).append(100 * (1 - (f1 - f0) / max(a0, 1)))
                res.setdefault("origin", []).append(100 * (1 - (f2 - f1) / max(during, 1)))
                res.setdefault("marker", []).append(100 * (h1 - h0) / max(during, 1))
                res.setdefault("scan_s", []).append(scan_s)
                res.setdefault("answers", []).append(during)
                if t == "lacquer":
                    stats1 = stack.lacquer_stats()["proxy"]
                    mem = stats1["hits_memory"] - stats0["hits_memory"]
                    disk = stats1["hits_disk"] - stats0["hits_disk"]
                    res.setdefault("from_memory", []).append(100 * mem / max(mem + disk, 1))
                log(f"scan round {r + 1} {t}: {during} hot answers during a {scan_s:.1f} s scan, "
                    f"{f2 - f1} hot refetches, {e1} errors")
        finally:
            stack.close()
    med = medians(raw)
    table(f"hot set under a scan: {hot_n} hot objects of {args.scan_kib} KiB read at {args.hot_rate} rps while "
          f"{scan_n} others ({scan_n * args.scan_kib // 1024} MiB) are read once, 8 at a time; memory 64 MiB "
          f"(lacquerd, Varnish); NGINX caches on disk; median of {args.rounds} rounds", targets, [
              ("hot set served without the origin, before the scan (%)", "before", "{:.2f}"),
              ("hot set served without the origin, during the scan (%)", "origin", "{:.2f}"),
              ("hot set hits by the target's marker, during the scan (%)", "marker", "{:.2f}"),
              ("lacquerd's hot hits from the memory tier, during the scan (%)", "from_memory", "{:.2f}"),
              ("scan duration (s)", "scan_s", "{:.1f}"),
              ("hot answers during the scan", "answers", "{:.0f}"),
          ], med, ["nginx", "varnish"])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    binary_flags(ap)
    ap.add_argument("--only", default=",".join(WORKLOADS), help="workloads to run, comma-separated")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds per measurement")
    ap.add_argument("--workdir", default=None, help="where the stores go (default: the system's temporary dir)")
    ap.add_argument("--seconds", type=int, default=8, help="ceiling: each wrk and oha run")
    ap.add_argument("--rate", type=int, default=5000, help="ceiling: oha's fixed rate for p50/p99")
    ap.add_argument("--profile", help="ceiling: write a perf profile's top symbols of lacquerd under wrk here")
    ap.add_argument("--objects", type=int, help="longtail (default 100000) and restart (default 1000000): objects")
    ap.add_argument("--longtail-rate", type=int, default=2000)
    ap.add_argument("--longtail-seconds", type=int, default=20)
    ap.add_argument("--longtail-profile", metavar="DIR",
                    help="longtail: after the rounds, a flame graph of lacquerd under the same load in DIR")
    ap.add_argument("--longtail-targets", default="lacquer,nginx,varnish",
                    help="longtail: targets, comma-separated (lacquer and nginx always start)")
    ap.add_argument("--stream-mib", type=int, default=200, help="stream: the large object's size")
    ap.add_argument("--stream-reads", type=int, default=5, help="stream: full reads per target and client count")
    ap.add_argument("--range-seconds", type=int, default=8,
                    help="stream: each oha run for the 64 KiB range's TTFB p99 at 500 rps (skipped without oha)")
    ap.add_argument("--restart-nginx", action=argparse.BooleanOptionalAction, default=True,
                    help="restart: fill NGINX with the same catalogue and time its first hit after a restart")
    ap.add_argument("--hot-objects", type=int, default=2000)
    ap.add_argument("--scan-objects", type=int, default=20000)
    ap.add_argument("--scan-kib", type=int, default=16, help="scan: size of every hot and scanned object")
    ap.add_argument("--hot-rate", type=int, default=400, help="scan: hot-set requests per second")
    args = ap.parse_args()
    only = args.only.split(",")
    for w in only:
        if w not in WORKLOADS:
            raise SystemExit(f"unknown workload {w}; known: {', '.join(WORKLOADS)}")
    check_binaries(args, ["lacquerd", "origin"] + (["ceiling"] if "ceiling" in only else []))
    print(f"lacquerd: {args.lacquerd}; {time.strftime('%Y-%m-%d %H:%M')}; load: {sh(['uptime']).strip()}")
    for w in WORKLOADS:
        if w in only:
            log(f"--- {w}")
            globals()[w](args)


if __name__ == "__main__":
    main()
