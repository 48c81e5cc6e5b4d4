#!/usr/bin/env python3
"""Issue 28: the seed's HLS workloads with prefetch on and off. One bench-origin serves video-on-demand HLS
streams (`/vod/ID/`: a playlist of --segments relative segments, each --segment-size bytes sent after
--origin-delay ms, all cacheable for an hour); players watch them through each target in turn:

  lacquer            lacquerd, the route `/vod/` without prefetch
  lacquer-playlist   the same route with `prefetch = { playlist = N }` (--playlist-n, default 2)
  lacquer-cmcd       the same route with `prefetch = { cmcd = true }`; only this target's players send
                     `CMCD-Request: nor="seg{k+1}.ts"` with every segment request
  nginx              proxy_cache on disk with proxy_cache_lock (bench/compare.py's), X-Cache-Status added
  varnish            varnishd -s malloc,256m, default VCL

--players players (default 20) watch --streams streams (default 3): player j joins at j x --stagger seconds
and watches stream j mod --streams, so each stream has one player who asks for every segment first (the
stream's first player) and others who join later. Each player runs in a process of its own (no interpreter
lock shared with another player's timing) on one keep-alive connection: it loads the playlist, then asks
for its segments in order, one every --interval seconds (0.5), or at once when the previous one took longer.

Every target gets new streams every round (stream IDs name the round and target: nothing is cached for them
yet), in an order that rotates between rounds (--rounds, default 3). Per target and round:

  segment TTFB, total       from sending the request to the response's head, and to its last byte
  cache hits                the share of segment requests the target answered from its cache, by its own
                            marker: lacquerd's `X-Cache: HIT` (a request that joined a fetch in flight, a
                            prefetch's among them, is `MISS` with `Cache-Status: ...; collapsed`); NGINX's
                            `X-Cache-Status: HIT` ($upstream_cache_status; a request that waited on the cache
                            lock is a HIT); Varnish's `X-Varnish` with two transaction IDs (a request that
                            waited on the fetch in flight is one)
  slower than the interval  segment requests that took longer than --interval: the player fell behind
  origin per segment        the origin's count for every segment of the run's streams, over the segments
                            (1.00: each fetched from the origin once); the worst segment beside
  the first players         TTFB and hit share of each stream's first player, for its segments after the
                            first: nobody asked for them before it, so it is what prefetch is for (no cache
                            has the first ahead: nobody asked for anything of the stream yet)
  wrong, errors             segments whose bytes are not that segment's (each follows the origin's pattern
                            from its path's FNV-1a hash mod 251 on); connection errors, timeouts, statuses
                            other than 200
  lacquerd's counters       prefetched, prefetch_hits, prefetch_wasted, prefetch_dropped (admin API),
                            and prefetched less hits: fetched ahead and not asked for by the end of the run
                            (wasted counts only those unasked for `unused_after`, 60 s)

Tables show medians over rounds; a ratio is the median of the per-round ratios. Binaries: --lacquerd
($LACQUERD), --origin ($BENCH_ORIGIN), else target/release/ (bench/run --prefetch builds them)."""

import argparse
import http.client
import json
import multiprocessing
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402
from compare import ROOT, stop, wait_port  # noqa: E402
from hotpath import log, print_table  # noqa: E402
from perf import hit, rotate  # noqa: E402

# Ports of their own, so that it can run beside the other benchmarks.
ORIGIN_PORT = compare.ORIGIN_PORT = 8770
PORTS = {"lacquer": 8771, "lacquer-playlist": 8772, "lacquer-cmcd": 8773, "nginx": 8774, "varnish": 8775}
LACQUER_ADMIN = {"lacquer": 8776, "lacquer-playlist": 8777, "lacquer-cmcd": 8778}
VARNISH_ADMIN = 8779
VARNISHD = shutil.which("varnishd") or "/usr/sbin/varnishd"
COUNTERS = ["prefetched", "prefetch_hits", "prefetch_wasted", "prefetch_dropped", "prefetch_refused"]


def fnv1a(text):
    """bench-origin's hash of a path (`bench_origin::fnv1a`): where a segment starts in the pattern."""
    h = 0xcbf29ce484222325
    for b in text.encode():
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def size_arg(text):
    m = re.fullmatch(r"(\d+)\s*(|B|KiB|MiB)", text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"{text}: a size such as 1MiB, 512KiB or 1048576")
    return int(m[1]) * {"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20}[m[2]]


def percentile(values, q):
    """Nearest rank."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


class Stack:
    def __init__(self, args):
        self.args, self.procs = args, {}
        self.work = tempfile.mkdtemp(prefix="lacquer-prefetch-", dir=args.workdir)
        env = {**os.environ, "BENCH_VOD_SEGMENTS": str(args.segments),
               "BENCH_VOD_SEGMENT_BYTES": str(args.segment_size), "BENCH_VOD_DELAY_MS": str(args.origin_delay)}
        self.procs["origin"] = subprocess.Popen([args.origin, str(ORIGIN_PORT)], env=env)
        wait_port(ORIGIN_PORT)
        self.counter = http.client.HTTPConnection("127.0.0.1", ORIGIN_PORT, timeout=30)
        self.counter.request("GET", "/vod/check/index.m3u8")
        resp = self.counter.getresponse()
        resp.read()
        if resp.status != 200:
            raise SystemExit(f"{args.origin} has no /vod/ route: rebuild bench-origin")
        for t in args.target_list:
            if t.startswith("lacquer"):
                self.lacquer(t)
            elif t == "nginx":
                self.nginx()
            else:
                self.varnish()
        for t in args.target_list:
            wait_port(PORTS[t])

    def lacquer(self, name):
        """One lacquerd per target: each has its own prefetch budget and counters."""
        work = f"{self.work}/{name}"
        os.makedirs(work)
        prefetch = {"lacquer": "", "lacquer-playlist": f"prefetch = {{ playlist = {self.args.playlist_n} }}\n",
                    "lacquer-cmcd": "prefetch = { cmcd = true }\n"}[name]
        with open(f"{work}/lacquer.toml", "w") as f:
            f.write(f'[[route]]\npath_prefix = "/vod/"\n{prefetch}')
        self.procs[name] = subprocess.Popen(
            [self.args.lacquerd, "--config", f"{work}/lacquer.toml", "--listen", f"127.0.0.1:{PORTS[name]}",
             "--admin", f"127.0.0.1:{LACQUER_ADMIN[name]}", "--backend", f"127.0.0.1:{ORIGIN_PORT}",
             "--disk", f"{work}/store", "--memory", "256MiB", "--disk-size", "2GiB"],
            env={**os.environ, "RUST_LOG": "warn"})

    def nginx(self):
        work = f"{self.work}/nginx"
        os.makedirs(work)
        conf = compare.nginx_conf(work, f"listen 127.0.0.1:{PORTS['nginx']};",
                                  "add_header X-Cache-Status $upstream_cache_status;")
        self.procs["nginx"] = subprocess.Popen(["/usr/sbin/nginx", "-c", conf, "-p", work], stdout=subprocess.DEVNULL)

    def varnish(self):
        self.procs["varnish"] = compare.varnish(
            self.work, PORTS["varnish"], VARNISH_ADMIN, ORIGIN_PORT, stderr=open(f"{self.work}/varnish.log", "w"))

    def counters(self, name):
        """lacquerd's prefetch counters (admin API)."""
        secret = open(f"{self.work}/{name}/store/secret").read().strip()
        req = urllib.request.Request(f"http://127.0.0.1:{LACQUER_ADMIN[name]}/v1/stats",
                                     headers={"authorization": f"Bearer {secret}"})
        proxy = json.loads(urllib.request.urlopen(req, timeout=30).read())["proxy"]
        return {k: proxy.get(k, 0) for k in COUNTERS}

    def origin_count(self, path):
        self.counter.request("GET", f"/__count{path}")
        resp = self.counter.getresponse()
        return int(resp.read())

    def close(self):
        self.counter.close()
        stop([p for name, p in self.procs.items() if name != "origin"] + [self.procs["origin"]], self.work)


def play(j, port, kind, stream, start_at, args, cmcd, pattern, results):
    """Player `j`, in a process of its own: the playlist, then every segment it lists, paced. Puts (j, its
    segment requests) on `results`, each (segment, TTFB s, total s, status, hit, bytes right, error)."""
    out = []
    time.sleep(max(0.0, start_at - time.monotonic()))
    con = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        con.request("GET", f"{stream}/index.m3u8")
        resp = con.getresponse()
        names = [line for line in resp.read().decode().splitlines() if line and not line.startswith("#")]
        if resp.status != 200 or not names:
            raise http.client.HTTPException(f"status {resp.status}, {len(names)} segments")
    except (OSError, UnicodeDecodeError, http.client.HTTPException) as e:
        results.put((j, [(-1, 0.0, 0.0, 0, False, False, f"{stream}/index.m3u8: {e!r}")]))
        return
    due = time.monotonic()
    for k, name in enumerate(names):
        time.sleep(max(0.0, due - time.monotonic()))
        path = f"{stream}/{name}"
        headers = {"CMCD-Request": f'nor="{names[k + 1]}"'} if cmcd and k + 1 < len(names) else {}
        begin = time.monotonic()
        due = begin + args.interval
        try:
            con.request("GET", path, headers=headers)
            resp = con.getresponse()
            ttfb = time.monotonic() - begin
            body = resp.read()
            total = time.monotonic() - begin
            shift = fnv1a(path) % 251
            right = body == pattern[shift:shift + args.segment_size]
            was_hit = hit(kind, {h.lower(): v for h, v in resp.getheaders()})
            out.append((k, ttfb, total, resp.status, was_hit, right, None if resp.status == 200 else
                        f"{path}: status {resp.status}"))
        except (OSError, http.client.HTTPException) as e:
            out.append((k, 0.0, time.monotonic() - begin, 0, False, False, f"{path}: {e!r}"))
            con.close()
            con = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    con.close()
    results.put((j, out))


def run(stack, args, target, r, pattern):
    """One run of the players against `target`: the row of numbers it adds."""
    streams = [f"/vod/r{r + 1}-{target}-{s}" for s in range(args.streams)]
    lacquer = target.startswith("lacquer")
    before = stack.counters(target) if lacquer else None
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    # Every player process is forked before the first one is due.
    t0 = time.monotonic() + 0.5 + 0.02 * args.players
    players = [ctx.Process(target=play, args=(j, PORTS[target], "lacquer" if lacquer else target,
                                              streams[j % args.streams], t0 + j * args.stagger, args,
                                              target == "lacquer-cmcd", pattern, results))
               for j in range(args.players)]
    for p in players:
        p.start()
    longest = args.players * args.stagger + args.segments * (args.interval + 30) + 60
    got = dict(results.get(timeout=longest) for _ in players)
    for p in players:
        p.join()
    elapsed = time.monotonic() - t0
    records = [rec for j in sorted(got) for rec in got[j]]
    segs = [rec for rec in records if rec[0] >= 0]
    ok = [rec for rec in segs if rec[6] is None]
    # Players 0 to streams-1 are each stream's first: nobody asked for their segments before them. Their first
    # segment no cache can have ahead (nobody asked for anything of the stream yet): what follows it can be.
    firsts = [rec for j in range(min(args.streams, args.players)) for rec in got[j] if rec[0] >= 1 and rec[6] is None]
    failed = [rec for rec in records if rec[6] is not None]
    wrong = [rec for rec in ok if not rec[5]]
    counts = {f"{s}/seg{k}.ts": stack.origin_count(f"{s}/seg{k}.ts") for s in streams for k in range(args.segments)}
    ms = lambda recs, i, q: 1000 * percentile([rec[i] for rec in recs], q)  # noqa: E731
    row = {
        "ttfb_p50": ms(ok, 1, 50), "ttfb_p99": ms(ok, 1, 99), "total_p50": ms(ok, 2, 50), "total_p99": ms(ok, 2, 99),
        "hits": 100 * sum(rec[4] for rec in ok) / max(len(ok), 1),
        "late": 100 * sum(rec[2] > args.interval for rec in segs) / max(len(segs), 1),
        "first_ttfb_p50": ms(firsts, 1, 50), "first_ttfb_p99": ms(firsts, 1, 99),
        "first_hits": 100 * sum(rec[4] for rec in firsts) / max(len(firsts), 1),
        "per_segment": sum(counts.values()) / len(counts), "worst_segment": max(counts.values()),
        "playlist_fetches": sum(stack.origin_count(f"{s}/index.m3u8") for s in streams),
        "failed": len(failed), "wrong": len(wrong),
    }
    extra = ""
    if lacquer:
        after = stack.counters(target)
        delta = {k: after[k] - before[k] for k in COUNTERS}
        row.update(delta)
        row["unasked"] = delta["prefetched"] - delta["prefetch_hits"]
        extra = "; lacquerd " + ", ".join(f"{k} +{v}" for k, v in delta.items())
    log(f"round {r + 1} {target}: {len(segs)} segment requests in {elapsed:.1f} s, {row['hits']:.1f} % hits "
        f"(first players {row['first_hits']:.1f} %), TTFB p50 {row['ttfb_p50']:.1f} p99 {row['ttfb_p99']:.1f} ms, "
        f"total p50 {row['total_p50']:.1f} p99 {row['total_p99']:.1f} ms, {row['late']:.1f} % slower than the "
        f"interval; origin {row['per_segment']:.2f} per segment (worst {row['worst_segment']}), "
        f"{row['playlist_fetches']} playlist fetches; {len(failed)} failed, {len(wrong)} wrong{extra}")
    again = [(p, n) for p, n in counts.items() if n > 1]
    if again:
        log(f"    {target}: asked of the origin more than once: " + ", ".join(f"{p} {n}" for p, n in again[:10]))
    for rec in failed[:5]:
        log(f"    {target} error: {rec[6]}")
    return row


def print_ratios(title, rows, raw, pairs):
    """A Markdown table of the median of per-round ratios a / b for each (a, b) in `pairs`, to three significant
    digits: a hit's TTFB over a miss's is a few thousandths."""
    print(f"\n{title}\n")
    print("| " + " | ".join(["metric"] + [f"{a} / {b}" for a, b in pairs]) + " |")
    print("|---" * (1 + len(pairs)) + "|")
    for label, key, _ in rows:
        cells = []
        for a, b in pairs:
            ratios = [x / y for x, y in zip(raw[a].get(key, []), raw[b].get(key, [])) if y]
            cells.append(f"{statistics.median(ratios):.3g}" if ratios else "-")
        print("| " + " | ".join([label] + cells) + " |", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--players", type=int, default=20)
    ap.add_argument("--streams", type=int, default=3, help="streams the players share (player j watches j mod this)")
    ap.add_argument("--stagger", type=float, default=0.25, help="seconds from one player's start to the next's")
    ap.add_argument("--interval", type=float, default=0.5, help="seconds from one segment request to the next")
    ap.add_argument("--segments", type=int, default=20, help="segments per stream")
    ap.add_argument("--segment-size", type=size_arg, default=1 << 20, help="1MiB (default); the seed's are 4MiB")
    ap.add_argument("--origin-delay", type=int, default=300, help="ms the origin waits before a segment's head")
    ap.add_argument("--playlist-n", type=int, default=2, help="lacquer-playlist's prefetch = { playlist = N }")
    ap.add_argument("--targets", default=",".join(PORTS), help="comma-separated among " + ", ".join(PORTS))
    ap.add_argument("--lacquerd", default=os.environ.get("LACQUERD", f"{ROOT}/target/release/lacquerd"))
    ap.add_argument("--origin", default=os.environ.get("BENCH_ORIGIN", f"{ROOT}/target/release/bench-origin"))
    ap.add_argument("--workdir", default=None, help="where the caches go (default: the system's temporary directory)")
    args = ap.parse_args()
    args.target_list = args.targets.split(",")
    if set(args.target_list) - set(PORTS):
        raise SystemExit(f"--targets: only these: {', '.join(PORTS)}")
    if "varnish" in args.target_list and not os.access(VARNISHD, os.X_OK):
        raise SystemExit("varnishd is not installed: apt-get install -y varnish (bench/run --prefetch installs it)")
    if "nginx" in args.target_list and not os.access("/usr/sbin/nginx", os.X_OK):
        raise SystemExit("nginx is not installed: apt-get install -y nginx-light (bench/run --prefetch installs it)")
    for flag, path in [("--lacquerd", args.lacquerd), ("--origin", args.origin)]:
        if not os.access(path, os.X_OK):
            raise SystemExit(f"{flag} {path}: not an executable (cargo build --release -p lacquerd -p bench-origin)")
    # Every segment is a slice of this, from its own place on: players compare bytes, nothing more.
    pattern = bytes(i % 251 for i in range(args.segment_size + 251))

    load_start = os.getloadavg()
    print(f"lacquerd: {args.lacquerd}; {time.strftime('%Y-%m-%d %H:%M')}; load average at start "
          + " ".join(f"{x:.2f}" for x in load_start), flush=True)
    raw = {t: {} for t in args.target_list}
    stack = Stack(args)
    try:
        for r in range(args.rounds):
            for t in rotate(args.target_list, r):
                for key, value in run(stack, args, t, r, pattern).items():
                    raw[t].setdefault(key, []).append(value)
    finally:
        stack.close()

    rows = [
        ("segment TTFB p50 (ms)", "ttfb_p50", "{:.1f}"),
        ("segment TTFB p99 (ms)", "ttfb_p99", "{:.1f}"),
        ("segment delivered whole p50 (ms)", "total_p50", "{:.1f}"),
        ("segment delivered whole p99 (ms)", "total_p99", "{:.1f}"),
        ("segment requests answered from the cache (%, the target's marker)", "hits", "{:.1f}"),
        (f"segment requests slower than the interval ({args.interval:g} s) (%)", "late", "{:.1f}"),
        ("each stream's first player, segments after its first: TTFB p50 (ms)", "first_ttfb_p50", "{:.1f}"),
        ("each stream's first player, segments after its first: TTFB p99 (ms)", "first_ttfb_p99", "{:.1f}"),
        ("each stream's first player, segments after its first: from the cache (%)", "first_hits", "{:.1f}"),
        ("origin requests per segment", "per_segment", "{:.2f}"),
    ]
    tail = [
        ("origin requests for the worst segment", "worst_segment", "{:.0f}"),
        ("origin playlist requests (all streams)", "playlist_fetches", "{:.0f}"),
        ("failed requests", "failed", "{:.0f}"),
        ("wrong segments", "wrong", "{:.0f}"),
        ("lacquerd: prefetched", "prefetched", "{:.0f}"),
        ("lacquerd: prefetch_hits", "prefetch_hits", "{:.0f}"),
        ("lacquerd: prefetched and not asked for by the end of the run", "unasked", "{:.0f}"),
        ("lacquerd: prefetch_wasted", "prefetch_wasted", "{:.0f}"),
        ("lacquerd: prefetch_dropped", "prefetch_dropped", "{:.0f}"),
    ]
    size = f"{args.segment_size / (1 << 20):g} MiB" if args.segment_size >= 1 << 20 else f"{args.segment_size} B"
    print_table(f"VOD HLS with prefetch on and off: {args.players} players on {args.streams} streams (one joining "
                f"every {args.stagger:g} s), {args.segments} segments of {size} each after {args.origin_delay} ms "
                f"at the origin, one every {args.interval:g} s; median of {args.rounds} rounds", args.target_list,
                rows + tail, raw, [])
    numerators = [t for t in ("lacquer-playlist", "lacquer-cmcd", "lacquer") if t in args.target_list]
    pairs = [(a, b) for a in numerators for b in ("lacquer", "nginx", "varnish") if b in args.target_list and a != b]
    if pairs:
        print_ratios("ratios (median of per-round ratios; below 1: less time, fewer hits, fewer origin requests)",
                     rows, raw, pairs)
    loads = [" ".join(f"{x:.2f}" for x in load) for load in (load_start, os.getloadavg())]
    print(f"\nload average at start {loads[0]}, at end {loads[1]}")
    if any(sum(raw[t].get("wrong", [])) for t in args.target_list):
        sys.exit(1)


if __name__ == "__main__":
    main()
