#!/usr/bin/env python3
"""Issue 28: live Low-Latency HLS through lacquerd, NGINX (proxy_cache with proxy_cache_lock) and Varnish, in one
run. One bench-origin makes a live stream from its start (`/live/`: a 25 600-byte part every 200 ms, four to a
segment; blocking playlist reloads and part requests held until the part exists); bench-live-players (Rust, in
bench/origin) runs N players against one target at a time, each asking for the hinted part and the blocking
reload that lists it at once, before the part exists, on two keep-alive connections of its own.

For each player count (--players, default 100,1000) and round (--rounds, default 3; the targets' order rotates
between rounds), each target gets --seconds (10) of players. Per target and round:

  origin requests per part       requests the origin counted for the parts the players fetched that were made
                                 during the run, over those parts (1.00: every part fetched from the origin
                                 once); the worst part beside
  origin playlist requests per   the origin's count of the blocking reloads for those parts' versions, plus its
  version                        plain playlist loads during the run, over the versions
  part TTFB p50/p99              from the moment the origin made the part (its end, on the origin's clock) to
                                 the response's head at the player; delivery: to its last byte. Parts made
                                 before the player joined (its first playlist may be up to a second old) are
                                 not timed; every later one is, also when the player asks for it late
  asked ahead                    the share of timed parts the player asked for before they existed: the rest
                                 it asked for late, having fallen behind the live edge
  delivered MB/s                 body bytes the players received per second: the stream's bytes the proxy
                                 held flowing to its players (players x about 1 Mbit/s when all keep up)
  peak RSS, RSS growth           the highest resident memory of the target's processes (sampled every 0.25 s)
                                 during the run, and that less theirs just before: what it held for the run's
                                 players (memory an allocator kept from an earlier run is not counted again)
  CPU per 1000 requests          user + system time of the target's processes (/proc/PID/stat: lacquerd; NGINX's
                                 master and workers; varnishd's manager and child) per 1000 player requests
  errors, wrong bytes            connection errors, timeouts and statuses other than 200; parts whose bytes
                                 were not that part's

Tables show medians over rounds; lacquer / other is the median of the per-round ratios. --targets may add
`origin`: the players against the origin itself, the floor of every TTFB (no ratio is taken against it).
Binaries: --lacquerd ($LACQUERD), --origin ($BENCH_ORIGIN), --players-bin ($BENCH_LIVE_PLAYERS), else
target/release/ (bench/run --live builds them)."""

import argparse
import http.client
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
from hotpath import log, print_table  # noqa: E402

# Ports of their own, so that it can run beside the other benchmarks.
ORIGIN_PORT = compare.ORIGIN_PORT = 8760
PORTS = {"lacquer": 8761, "nginx": 8762, "varnish": 8763, "origin": ORIGIN_PORT}
LACQUER_ADMIN, VARNISH_ADMIN = 8764, 8765
VARNISHD = shutil.which("varnishd") or "/usr/sbin/varnishd"

# Held requests wait up to 3 s at the origin (its refusal horizon): every timeout on the way must be longer.
# NGINX's lock: requests for a part another request is fetching wait for it (proxy_cache_lock_timeout, past
# which they would go to the origin on their own, uncached); proxy_cache_lock_age likewise before a second
# request is let through. proxy_cache_valid only applies to answers without Cache-Control, which the origin
# never sends; the key is the request's URI with its query, so each blocking reload is an entry of its own.
NGINX_LIVE = """proxy_cache_key $request_uri;
            proxy_cache_lock_timeout 10s;
            proxy_cache_lock_age 10s;
            proxy_cache_valid 200 1s;
            proxy_read_timeout 10s;
            add_header X-Cache-Status $upstream_cache_status;"""


def origin_get(con, path):
    con.request("GET", path)
    resp = con.getresponse()
    body = resp.read()
    if resp.status != 200:
        raise RuntimeError(f"origin {path}: {resp.status}")
    return body


def origin_count(con, path):
    return int(origin_get(con, f"/__count{path}"))


def part_path(k):
    return f"/live/s{k // 4}.p{k % 4}.m4s"


def reload_path(k):
    return f"/live/index.m3u8?_HLS_msn={k // 4}&_HLS_part={k % 4}"


def rss_bytes(pid):
    total = 0
    for p in tree(pid):
        try:
            with open(f"/proc/{p}/status") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) * 1024
        except (OSError, StopIteration):
            continue
    return total


class Peak(threading.Thread):
    """The highest RSS of a process tree, sampled until stopped."""

    def __init__(self, pid):
        super().__init__(daemon=True)
        self.pid, self.peak, self.done = pid, rss_bytes(pid), threading.Event()
        self.start()

    def run(self):
        while not self.done.wait(0.25):
            self.peak = max(self.peak, rss_bytes(self.pid))

    def stop(self):
        self.done.set()
        self.join()
        return self.peak


class Stack:
    def __init__(self, args):
        self.args, self.procs = args, {}
        self.work = tempfile.mkdtemp(prefix="lacquer-live-", dir=args.workdir)
        env = {**os.environ, "BENCH_LIVE_PART_MS": str(args.part_ms), "BENCH_LIVE_PART_BYTES": str(args.part_bytes)}
        self.procs["origin"] = subprocess.Popen([args.origin, str(ORIGIN_PORT)], env=env)
        wait_port(ORIGIN_PORT)
        self.counter = http.client.HTTPConnection("127.0.0.1", ORIGIN_PORT, timeout=30)
        try:
            json.loads(origin_get(self.counter, "/live/__t0"))
        except (RuntimeError, ValueError):
            raise SystemExit(f"{args.origin} has no /live/ route: rebuild bench-origin")
        starts = {"lacquer": self.lacquer, "nginx": self.nginx, "varnish": self.varnish}
        for t in args.target_list:
            if t in starts:
                starts[t]()
        for t in args.target_list:
            wait_port(PORTS[t])

    def lacquer(self):
        self.procs["lacquer"] = subprocess.Popen(
            [self.args.lacquerd, "--listen", f"127.0.0.1:{PORTS['lacquer']}", "--admin", f"127.0.0.1:{LACQUER_ADMIN}",
             "--backend", f"127.0.0.1:{ORIGIN_PORT}", "--disk", f"{self.work}/lacquer", "--memory", "256MiB",
             "--disk-size", "2GiB"],
            env={**os.environ, "RUST_LOG": "warn"})

    def nginx(self):
        work = f"{self.work}/nginx"
        os.makedirs(work)
        conf = compare.nginx_conf(work, f"listen 127.0.0.1:{PORTS['nginx']};", NGINX_LIVE)
        self.procs["nginx"] = subprocess.Popen(["/usr/sbin/nginx", "-c", conf, "-p", work], stdout=subprocess.DEVNULL)

    def varnish(self):
        # The default VCL coalesces (the waiting list) and streams; first_byte_timeout (60 s by default) is set
        # so that a held fetch is plainly within it.
        self.procs["varnish"] = compare.varnish(
            self.work, PORTS["varnish"], VARNISH_ADMIN, ORIGIN_PORT, ["first_byte_timeout=10"],
            stderr=open(f"{self.work}/varnish.log", "w"))

    def lacquer_hls(self):
        """lacquerd's blocking-reload counters (admin API)."""
        secret = open(f"{self.work}/lacquer/secret").read().strip()
        req = urllib.request.Request(f"http://127.0.0.1:{LACQUER_ADMIN}/v1/stats",
                                     headers={"authorization": f"Bearer {secret}"})
        proxy = json.loads(urllib.request.urlopen(req, timeout=30).read())["proxy"]
        return {k: v for k, v in proxy.items() if k.startswith("hls_")}

    def close(self):
        self.counter.close()
        stop([p for name, p in self.procs.items() if name != "origin"] + [self.procs["origin"]], self.work)


def run(stack, args, target, players, r):
    """One run of the players against `target`: the row of numbers it adds."""
    pid = stack.procs[target].pid
    con = stack.counter
    plain_before = origin_count(con, "/live/index.m3u8")
    # The part in the making now may have been asked for by the previous run's players: counts start after it.
    made_before = json.loads(origin_get(con, "/live/__t0"))["made"]
    hls_before = stack.lacquer_hls() if target == "lacquer" else None
    cpu_before, rss_before = cpu_seconds(pid), rss_bytes(pid)
    peak = Peak(pid)
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(
        [args.players_bin, "--target", f"127.0.0.1:{PORTS[target]}", "--origin", f"127.0.0.1:{ORIGIN_PORT}",
         "--players", str(players), "--seconds", str(args.seconds), "--ramp-ms", str(args.ramp_ms)],
        capture_output=True, text=True)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = cpu_seconds(pid) - cpu_before
    rss_peak = peak.stop()
    if proc.returncode != 0:
        raise SystemExit(f"bench-live-players failed against {target}: {proc.stderr.strip()}")
    res = json.loads(proc.stdout)
    first, last = res["first_part"], res["last_part"]
    if first is None:
        raise SystemExit(f"{target}: no player got a part: {res}")
    parts = range(max(first, made_before + 1), last + 1)
    part_counts = [origin_count(con, part_path(k)) for k in parts]
    reload_counts = [origin_count(con, reload_path(k)) for k in parts]
    plain = origin_count(con, "/live/index.m3u8") - plain_before
    failed = res["errors"] + sum(res["statuses"].values())
    row = {
        "ttfb_p50": res["part_ttfb_ms"]["p50"],
        "ttfb_p99": res["part_ttfb_ms"]["p99"],
        "delivery_p50": res["part_delivery_ms"]["p50"],
        "delivery_p99": res["part_delivery_ms"]["p99"],
        "reload_p50": res["reload_delivery_ms"]["p50"],
        "reload_p99": res["reload_delivery_ms"]["p99"],
        "ahead": 100 * res["ahead"] / max(res["timed"], 1),
        "mbs": res["bytes"] / res["seconds"] / 1e6,
        "rss_peak": rss_peak / (1 << 20),
        "rss": max(rss_peak - rss_before, 0) / (1 << 20),
        "cpu": 1000 * cpu / max(res["requests"] / 1000, 1e-9),
        "players_cpu": 1000 * (children.ru_utime + children.ru_stime - children_before.ru_utime
                                - children_before.ru_stime) / max(res["requests"] / 1000, 1e-9),
        "failed": failed,
        "wrong": res["wrong_bytes"] + res["wrong_playlists"],
    }
    # Against the origin itself every count is the players' own requests, not a cache's: none taken.
    if target != "origin":
        row.update(per_part=sum(part_counts) / len(parts), worst_part=max(part_counts),
                   per_version=(sum(reload_counts) + plain) / len(parts), worst_version=max(reload_counts))
    hls = ""
    if hls_before is not None:
        hls = "; lacquerd " + ", ".join(f"{k} +{v - hls_before.get(k, 0)}" for k, v in stack.lacquer_hls().items())
    fetched = ""
    if target != "origin":
        fetched = (f", origin {row['per_part']:.2f} per part (worst {row['worst_part']}), {row['per_version']:.2f} per "
                   f"playlist version ({plain} plain loads; worst reload {row['worst_version']})")
    log(f"{players} players round {r + 1} {target}: parts {first}-{last}, {res['parts']} fetched "
        f"({res['catching_up']} while joining, {row['ahead']:.1f} % of the others asked ahead){fetched}; TTFB p50 {row['ttfb_p50']:.1f} "
        f"p99 {row['ttfb_p99']:.1f} ms; {row['mbs']:.1f} MB/s; RSS {row['rss_peak']:.0f} MiB (+{row['rss']:.1f}); "
        f"{row['cpu']:.0f} ms CPU per 1000 requests; {failed} failed ({res['statuses']}), {res['wrong_bytes']} "
        f"wrong parts, {res['wrong_playlists']} wrong playlists{hls}")
    if target != "origin":
        again = [(reload_path(k), n) for k, n in zip(parts, reload_counts) if n > 1]
        again += [(part_path(k), n) for k, n in zip(parts, part_counts) if n > 1]
        if again:
            log(f"    {target}: asked of the origin more than once: " + ", ".join(f"{p} {n}" for p, n in again[:10]))
    for sample in res["error_samples"]:
        log(f"    {target} error: {sample}")
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--players", default="100,1000", help="player counts, comma-separated")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=10, help="each run of the players")
    ap.add_argument("--ramp-ms", type=int, default=1000, help="the players join spread over this long")
    ap.add_argument("--targets", default="lacquer,nginx,varnish",
                    help="comma-separated among lacquer, nginx, varnish and origin (no cache: the floor)")
    ap.add_argument("--part-ms", type=int, default=200, help="the origin's part duration")
    ap.add_argument("--part-bytes", type=int, default=25600, help="each part's size (25 600: about 1 Mbit/s)")
    ap.add_argument("--lacquerd", default=os.environ.get("LACQUERD", f"{ROOT}/target/release/lacquerd"))
    ap.add_argument("--origin", default=os.environ.get("BENCH_ORIGIN", f"{ROOT}/target/release/bench-origin"))
    ap.add_argument("--players-bin",
                    default=os.environ.get("BENCH_LIVE_PLAYERS", f"{ROOT}/target/release/bench-live-players"))
    ap.add_argument("--workdir", default=None, help="where the caches go (default: the system's temporary directory)")
    args = ap.parse_args()
    args.target_list = args.targets.split(",")
    if set(args.target_list) - set(PORTS) or "lacquer" not in args.target_list:
        raise SystemExit(f"--targets must name lacquer and only these: {', '.join(PORTS)}")
    if "varnish" in args.target_list and not os.access(VARNISHD, os.X_OK):
        raise SystemExit("varnishd is not installed: apt-get install -y varnish (bench/run --live installs it), "
                         "or leave it out with --targets lacquer,nginx")
    if "nginx" in args.target_list and not os.access("/usr/sbin/nginx", os.X_OK):
        raise SystemExit("nginx is not installed: apt-get install -y nginx-light (bench/run --live installs it)")
    binaries = [("--lacquerd", args.lacquerd), ("--origin", args.origin), ("--players-bin", args.players_bin)]
    for flag, path in binaries:
        if not os.access(path, os.X_OK):
            raise SystemExit(f"{flag} {path}: not an executable (cargo build --release -p lacquerd -p bench-origin)")
    counts = [int(n) for n in args.players.split(",")]

    load_start = os.getloadavg()
    print(f"lacquerd: {args.lacquerd}; {time.strftime('%Y-%m-%d %H:%M')}; load average at start "
          + " ".join(f"{x:.2f}" for x in load_start), flush=True)
    raw = {n: {t: {} for t in args.target_list} for n in counts}
    stack = Stack(args)
    try:
        for n in counts:
            for r in range(args.rounds):
                shift = r % len(args.target_list)
                for t in args.target_list[shift:] + args.target_list[:shift]:
                    for key, value in run(stack, args, t, n, r).items():
                        raw[n][t].setdefault(key, []).append(value)
    finally:
        stack.close()

    versus = [t for t in args.target_list if t not in ("lacquer", "origin")]
    mbit = args.part_bytes * 8 / args.part_ms / 1000
    for n in counts:
        print_table(f"live LL-HLS, {n} players ({args.part_bytes} B parts every {args.part_ms} ms: {mbit:.2f} Mbit/s "
                    f"each), {args.seconds:g} s per run; median of {args.rounds} rounds, ratios are medians of "
                    "per-round ratios", args.target_list, [
                        ("origin requests per part", "per_part", "{:.2f}"),
                        ("origin requests for the worst part", "worst_part", "{:.0f}"),
                        ("origin playlist requests per playlist version", "per_version", "{:.2f}"),
                        ("origin requests for the worst blocking reload", "worst_version", "{:.0f}"),
                        ("part TTFB p50 (ms after the origin made it)", "ttfb_p50", "{:.1f}"),
                        ("part TTFB p99 (ms)", "ttfb_p99", "{:.1f}"),
                        ("part delivered whole p50 (ms)", "delivery_p50", "{:.1f}"),
                        ("part delivered whole p99 (ms)", "delivery_p99", "{:.1f}"),
                        ("blocking reload delivered p50 (ms)", "reload_p50", "{:.1f}"),
                        ("blocking reload delivered p99 (ms)", "reload_p99", "{:.1f}"),
                        ("timed parts asked for before they existed (%: at the live edge)", "ahead", "{:.1f}"),
                        ("delivered to players (MB/s)", "mbs", "{:.1f}"),
                        ("peak RSS during the run (MiB, all its processes)", "rss_peak", "{:.0f}"),
                        ("RSS growth during the run (MiB)", "rss", "{:.1f}"),
                        ("target CPU per 1000 player requests (ms)", "cpu", "{:.1f}"),
                        ("players' own CPU per 1000 requests (ms)", "players_cpu", "{:.1f}"),
                        ("failed requests", "failed", "{:.0f}"),
                        ("wrong parts or playlists", "wrong", "{:.0f}"),
                    ], raw[n], versus)
    loads = [" ".join(f"{x:.2f}" for x in load) for load in (load_start, os.getloadavg())]
    print(f"\nload average at start {loads[0]}, at end {loads[1]}")
    if any(sum(raw[n][t].get("wrong", [])) for n in counts for t in args.target_list):
        sys.exit(1)


if __name__ == "__main__":
    main()
