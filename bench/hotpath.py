#!/usr/bin/env python3
"""Issue 25's benchmarks: lacquerd, NGINX, Varnish and the bare hyper ceiling (bench/ceiling) in front of one
origin, in one run; every measurement interleaves the targets and rotates their order between rounds, and
every ratio is the median of the per-round ratios (lacquer / other). Workloads (select with --only):

  hits      hits for a client sending no Accept-Encoding (plain wrk) and for one sending
            `gzip, deflate, br`, on a 2 KiB HLS manifest and a 200 KiB HTML page: requests per second with
            wrk -t1 -c100 (as issue 25 measured), and what each target sends each client
  misses    every request a new 1 KiB URL (wrk with a Lua script), at 50 and 500 connections: rps, p50, p99,
            and the CPU the target's processes spent per 1000 requests (/proc/PID/stat)
  large     bench/perf.py's `stream`: a 200 MiB body from lacquerd's disk tier read by 1 and by 4 clients,
            the 4 MiB hit's first byte (curl), a 64 KiB range of it: TTFB p99 at 500 rps (oha)
  longtail  bench/perf.py's `longtail` at 100 000 objects of 1 KiB (and 1 000 000 with --million)

--profile records `perf record --call-graph dwarf` of lacquerd during one identity-hit run (the manifest) and
one miss run (50 connections) and writes flame graphs (inferno) to bench/profiles/.

The binaries come from --lacquerd, --origin, --ceiling (defaults: $LACQUERD, $BENCH_ORIGIN, $BENCH_CEILING,
else the three in $BENCH_BIN, else target/release as bench/run builds them)."""

import argparse
import http.client
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import perf  # noqa: E402
from compare import ORIGIN_PORT, ROOT, nginx_conf, sh, tree  # noqa: E402
from compression import decode  # noqa: E402

WORKLOADS = ["hits", "misses", "large", "longtail"]
PORTS = {"lacquer": 8981, "varnish": 8982, "nginx": 8983, "ceiling": perf.CEILING_PORT, "nginx-plain": 8985,
         "varnish-plain": 8986}
VARNISH_ADMIN = {"varnish": 8992, "varnish-plain": 8993}
BODIES = [
    ("manifest", "/hls/channel-7/720p.m3u8", "2 KiB HLS manifest (application/vnd.apple.mpegurl)"),
    ("page", "/page/front.html", "200 KiB HTML page (text/html)"),
]
CLIENTS = [("identity", None), ("gzip", "gzip, deflate, br")]
GZIP_CLIENT = dict(CLIENTS)["gzip"]

# An operator's NGINX compression in front of an origin that does not compress: compress text on the way out
# (text/html always; the other text types named), say so in Vary, and gunzip for clients that take no gzip
# when the upstream sent gzip. NGINX caches what the origin sent, so it compresses on every gzip hit.
NGINX_GZIP = """gzip on;
            gzip_comp_level {level};
            gzip_vary on;
            gunzip on;
            gzip_types text/plain text/css text/xml application/json application/javascript application/xml
                       application/vnd.apple.mpegurl application/x-mpegurl image/svg+xml;"""

# Varnish's users guide ("Compression"): with http_gzip_support (on by default) Varnish asks the origin for
# gzip; beresp.do_gzip compresses an uncompressed text answer once, before it is stored. Varnish then serves
# the stored gzip to clients that take it and gunzips it on every hit for those that do not.
VCL_GZIP = """
sub vcl_backend_response {
    if (!beresp.http.Content-Encoding && beresp.http.Content-Type ~
            "^(text/|application/(json|javascript|xml|vnd\\.apple\\.mpegurl|x-mpegurl)|image/svg\\+xml)") {
        set beresp.do_gzip = true;
    }
}
"""

# wrk prints its results through this hook as one JSON line (latencies in microseconds).
WRK_REPORT = """
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('WRKJSON {"requests": %d, "duration_us": %d, "bytes": %d, "connect": %d, "read": %d, '
    .. '"write": %d, "status": %d, "timeout": %d, "p50_us": %d, "p99_us": %d}\\n', summary.requests,
    summary.duration, summary.bytes, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(99)))
end
"""

# Every request a URL nobody asked for: the prefix (per run) comes as the script's argument, each thread
# numbers its own requests.
WRK_NEW_URLS = """
local threads = 0
setup = function(thread)
  thread:set("tid", threads)
  threads = threads + 1
end
local prefix, n = "/new/", 0
init = function(args)
  prefix = (args[1] or "/new/") .. tid .. "-"
end
request = function()
  n = n + 1
  return wrk.format(nil, prefix .. n)
end
""" + WRK_REPORT
SCRIPTS = {"report": WRK_REPORT, "new-urls": WRK_NEW_URLS}


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def kind(name):
    """The software behind a target: `nginx-plain` is NGINX."""
    return name.split("-")[0]


def hit(name, headers):
    return perf.hit(kind(name), headers)


class HotStack(perf.Stack):
    """perf.py's stack with NGINX and Varnish set up for compression as their operators would (and, for the
    `-plain` targets, without it), each in a directory of its own."""

    def port(self, name):
        return PORTS[name]

    def nginx_target(self, name):
        work = f"{self.work}/{name}"
        extra = "add_header X-Cache-Status $upstream_cache_status;"
        if name == "nginx":
            extra += "\n            " + NGINX_GZIP.format(level=self.args.nginx_gzip_level)
        conf = nginx_conf(work, f"listen 127.0.0.1:{PORTS[name]};", extra)
        self.procs[name] = subprocess.Popen(["/usr/sbin/nginx", "-c", conf, "-p", work], stdout=subprocess.DEVNULL)

    def varnish_target(self, name):
        vcl = f"{self.work}/{name}.vcl"
        with open(vcl, "w") as f:
            f.write(f'vcl 4.1;\nbackend origin {{ .host = "127.0.0.1"; .port = "{ORIGIN_PORT}"; }}\n')
            if name == "varnish":
                f.write(VCL_GZIP)
        self.procs[name] = subprocess.Popen(
            ["/usr/sbin/varnishd", "-F", "-j", "none", "-n", f"{self.work}/{name}", "-a", f"127.0.0.1:{PORTS[name]}",
             "-f", vcl, "-s", "malloc,256m", "-T", f"127.0.0.1:{VARNISH_ADMIN[name]}", "-p", "http_gzip_support=on"],
            stdout=subprocess.DEVNULL, stderr=open(f"{self.work}/{name}.log", "w"))

    def start(self, targets):
        for t in targets:
            if t == "lacquer":
                self.lacquer()
            elif kind(t) == "nginx":
                self.nginx_target(t)
            elif kind(t) == "varnish":
                self.varnish_target(t)
            else:
                self.ceiling()
        self.ready()

    def cpu_seconds(self, name):
        """User + system time so far of the target's processes: lacquerd; NGINX's master and workers;
        varnishd's manager and child."""
        ticks = 0
        for pid in tree(self.procs[name].pid):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            ticks += int(fields[11]) + int(fields[12])
        return ticks / os.sysconf("SC_CLK_TCK")


def wrk(args, port, path, conns, seconds, header=None, script="report", script_args=()):
    """One wrk run (-t`--wrk-threads`, `conns` connections) with one of SCRIPTS: its JSON report, with rps."""
    cmd = ["wrk", f"-t{args.wrk_threads}", f"-c{conns}", f"-d{seconds}s", "-s", f"{args.scripts}/{script}.lua"]
    if header:
        cmd += ["-H", f"Accept-Encoding: {header}"]
    cmd += [f"http://127.0.0.1:{port}{path}"]
    if script_args:
        cmd += ["--"] + list(script_args)
    out = sh(cmd)
    for line in out.splitlines():
        if line.startswith("WRKJSON "):
            res = json.loads(line[len("WRKJSON "):])
            res["rps"] = res["requests"] / (res["duration_us"] / 1e6)
            errors = {k: res[k] for k in ("connect", "read", "write", "status", "timeout") if res[k]}
            if errors:
                log(f"wrk {port}{path} -c{conns}: errors {errors} of {res['requests']} requests")
            return res
    raise RuntimeError(out)


def fetch(port, path, header):
    """(status, lower-case headers, body) of one GET on a fresh connection, with `Accept-Encoding: header` or,
    like wrk, none at all (http.client's request() would send `identity`)."""
    con = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        con.putrequest("GET", path, skip_accept_encoding=True)
        if header:
            con.putheader("Accept-Encoding", header)
        con.endheaders()
        resp = con.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        con.close()


def per_round_ratio(raw, key, a, b):
    """Median over rounds of raw[a][key][r] / raw[b][key][r]."""
    pairs = [x / y for x, y in zip(raw[a].get(key, []), raw[b].get(key, [])) if y]
    return f"{statistics.median(pairs):.2f}" if pairs else "-"


def print_table(title, targets, rows, raw, versus):
    """A Markdown table of medians over rounds; `rows` are (label, key, format); a column of lacquer / v
    (median of the per-round ratios) for each v in `versus`."""
    print(f"\n{title}\n")
    print("| " + " | ".join(["metric"] + targets + [f"lacquer / {v}" for v in versus]) + " |")
    print("|---" * (1 + len(targets) + len(versus)) + "|")
    for label, key, fmt in rows:
        cells = [fmt.format(statistics.median(raw[t][key])) if raw[t].get(key) else "-" for t in targets]
        ratios = [per_round_ratio(raw, key, "lacquer", v) for v in versus]
        print("| " + " | ".join([label] + cells + ratios) + " |", flush=True)


# ------------------------------------------------------------------------------------------------ profiles

def flame_graph(stack, args, name, title, load):
    """perf record (DWARF call graphs: the release build has debug info but no frame pointers) of lacquerd
    while `load()` runs, folded into bench/profiles/`name`.svg; the ten hottest leaf functions go to stderr."""
    if not (shutil.which("perf") and shutil.which("inferno-flamegraph")):
        log("profile: needs perf (apt-get install linux-perf) and inferno (cargo install inferno)")
        return
    os.makedirs(args.profile_dir, exist_ok=True)
    data = f"{stack.work}/{name}.perf.data"
    rec = subprocess.Popen(["perf", "record", "-F", "499", "--call-graph", "dwarf,16384",
                            "-p", str(stack.procs["lacquer"].pid), "-o", data, "--", "sleep", str(args.seconds)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    load()
    rec.wait()
    started = time.time()
    folded = f"{stack.work}/{name}.folded"
    with open(folded, "w") as out:
        # Resolving inlined frames costs addr2line about 40 s per thousand samples of this binary.
        script = subprocess.Popen(["perf", "script", "-i", data] + ([] if args.profile_inline else ["--no-inline"]),
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        subprocess.run(["inferno-collapse-perf"], stdin=script.stdout, stdout=out, check=True)
        script.wait()
    svg = f"{args.profile_dir}/{name}.svg"
    with open(folded) as f, open(svg, "w") as out:
        subprocess.run(["inferno-flamegraph", "--title", title], stdin=f, stdout=out, check=True)
    leaves, total = {}, 0
    for line in open(folded):
        frames, _, count = line.rstrip("\n").rpartition(" ")
        leaf = frames.rsplit(";", 1)[-1]
        leaves[leaf] = leaves.get(leaf, 0) + int(count)
        total += int(count)
    top = sorted(leaves.items(), key=lambda kv: -kv[1])[:10]
    log(f"profile {svg} (folded in {time.time() - started:.0f} s); hottest leaves: "
        + "; ".join(f"{100 * n / max(total, 1):.1f}% {leaf[:80]}" for leaf, n in top))


# ---------------------------------------------------------------------------------------------------- hits

def hits(args):
    targets = args.target_list
    stack = HotStack(args)
    try:
        stack.start(targets)
        cached = [t for t in targets if t != "ceiling"]
        originals = {}
        for body, path, _ in BODIES:
            status, _, data = fetch(ORIGIN_PORT, path, None)
            if status != 200:
                raise SystemExit(f"the origin ({args.origin}) answers {status} for {path}: a bench-origin from "
                                 "before issue 25's benchmark (no /hls/ and /page/ routes)")
            originals[body] = data
            for t in cached:
                for _, header in CLIENTS:
                    for _ in range(3):
                        fetch(PORTS[t], path, header)
        # What every target sends every client, checked once before the load (and printed with the results).
        served = {}
        for body, path, _ in BODIES:
            for client, header in CLIENTS:
                for t in targets:
                    status, headers, data = fetch(PORTS[t], path, header)
                    coding = headers.get("content-encoding", "identity")
                    try:
                        same = decode(coding, data) == (originals[body] if t != "ceiling" else data)
                    except (ImportError, ValueError, OSError, zlib.error) as e:
                        same = f"not checked ({e})"
                    served[(body, client, t)] = (status, coding, len(data), same, hit(t, headers))
                    if status != 200 or same is False:
                        log(f"hits: {t} answered {status} {coding} for {path} ({client} client): "
                            f"{'body differs from the origin' if same is False else same}")
        raw = {(body, client): {t: {} for t in targets} for body, _, _ in BODIES for client, _ in CLIENTS}
        for r in range(args.rounds):
            for body, path, _ in BODIES:
                for client, header in CLIENTS:
                    # The ceiling answers every request with 2 KiB: only the manifest's size is its own.
                    case_targets = targets if body == "manifest" else cached
                    for t in perf.rotate(case_targets, r):
                        res = wrk(args, PORTS[t], path, 100, args.seconds, header)
                        raw[(body, client)][t].setdefault("rps", []).append(res["rps"])
                        raw[(body, client)][t].setdefault("p99", []).append(res["p99_us"] / 1000)
                        log(f"hits round {r + 1} {body} {client} {t}: {res['rps']:.0f} rps")
        if args.profile:
            path = dict((b, p) for b, p, _ in BODIES)["manifest"]
            flame_graph(stack, args, "hit-identity",
                        "lacquerd: identity client, hits on the 2 KiB manifest (wrk -t1 -c100)",
                        lambda: wrk(args, PORTS["lacquer"], path, 100, args.seconds))
            flame_graph(stack, args, "hit-gzip",
                        "lacquerd: gzip client, hits on the 2 KiB manifest (wrk -t1 -c100)",
                        lambda: wrk(args, PORTS["lacquer"], path, 100, args.seconds, GZIP_CLIENT))
    finally:
        stack.close()
    for body, path, label in BODIES:
        case_targets = targets if body == "manifest" else [t for t in targets if t != "ceiling"]
        versus = [t for t in case_targets if t != "lacquer"]
        merged = {t: {} for t in case_targets}
        rows = []
        for client, header in CLIENTS:
            for t in case_targets:
                for key in ("rps", "p99"):
                    merged[t][f"{client}_{key}"] = raw[(body, client)][t].get(key, [])
            what = "no Accept-Encoding" if header is None else f"Accept-Encoding: {header}"
            rows += [(f"{client} client ({what}): rps", f"{client}_rps", "{:.0f}"),
                     (f"{client} client: latency p99 (ms, wrk's)", f"{client}_p99", "{:.2f}")]
        print_table(f"hits, {label} `{path}`, wrk -t{args.wrk_threads} -c100 -d{args.seconds}s; median of "
                    f"{args.rounds} rounds, ratios are medians of per-round ratios", case_targets, rows, merged,
                    versus)
        print("\nwhat each target sent (one request per client before the load): status, coding, body bytes, "
              "decoded body equal to the origin's, hit\n")
        print("| client | " + " | ".join(case_targets) + " |\n|---" * 1 + "|---" * len(case_targets) + "|")
        for client, _ in CLIENTS:
            cells = []
            for t in case_targets:
                status, coding, size, same, was_hit = served[(body, client, t)]
                check = "ok" if same is True else ("DIFFERS" if same is False else same)
                cells.append(f"{status} {coding} {size} B {check}{' hit' if was_hit else ''}")
            print(f"| {client} | " + " | ".join(cells) + " |")
    if "ceiling" in targets:
        print("\nThe ceiling (bench/ceiling) answers every request with the same 2048 bytes (identity, whatever "
              "the client accepts): it is measured on the manifest only, whose identity body has that size.")


# -------------------------------------------------------------------------------------------------- misses

def misses(args):
    targets = [t for t in args.target_list if t != "ceiling"]
    stack = HotStack(args)
    raw = {c: {t: {} for t in targets} for c in args.miss_conns}
    try:
        stack.start(targets)
        status, _, _ = fetch(ORIGIN_PORT, "/new/check", None)
        if status != 200 or perf.origin_count("/new") != 1:
            raise SystemExit(f"the origin ({args.origin}) has no /new/ route counted as /new: a bench-origin "
                             "from before issue 25's benchmark")
        for conns in args.miss_conns:
            for r in range(args.rounds):
                for t in perf.rotate(targets, r):
                    before_cpu, before_fetches = stack.cpu_seconds(t), perf.origin_count("/new")
                    res = wrk(args, PORTS[t], "/", conns, args.seconds, script="new-urls",
                              script_args=[f"/new/{t}-{conns}-{r}-"])
                    cpu = stack.cpu_seconds(t) - before_cpu
                    fetches = perf.origin_count("/new") - before_fetches
                    out = raw[conns][t]
                    out.setdefault("rps", []).append(res["rps"])
                    out.setdefault("p50", []).append(res["p50_us"] / 1000)
                    out.setdefault("p99", []).append(res["p99_us"] / 1000)
                    out.setdefault("cpu", []).append(1000 * cpu / max(res["requests"] / 1000, 1e-9))
                    out.setdefault("fetched", []).append(fetches / max(res["requests"], 1))
                    log(f"misses round {r + 1} -c{conns} {t}: {res['rps']:.0f} rps, p99 {res['p99_us'] / 1000:.2f} ms, "
                        f"{out['cpu'][-1]:.0f} ms CPU per 1000, {fetches} origin fetches for {res['requests']}")
        if args.profile:
            flame_graph(stack, args, "miss", "lacquerd: misses, every request a new 1 KiB URL (wrk -t1 -c50)",
                        lambda: wrk(args, PORTS["lacquer"], "/", 50, args.seconds, script="new-urls",
                                    script_args=["/new/profile-"]))
    finally:
        stack.close()
    versus = [t for t in targets if t != "lacquer"]
    for conns in args.miss_conns:
        print_table(f"misses: every request a new 1 KiB URL, wrk -t{args.wrk_threads} -c{conns} -d{args.seconds}s; "
                    f"median of {args.rounds} rounds, ratios are medians of per-round ratios", targets, [
                        ("requests/s", "rps", "{:.0f}"),
                        ("latency p50 (ms, wrk's)", "p50", "{:.2f}"),
                        ("latency p99 (ms, wrk's)", "p99", "{:.2f}"),
                        ("target CPU per 1000 requests (ms, user + system, all its processes)", "cpu", "{:.0f}"),
                        ("origin fetches per request", "fetched", "{:.2f}"),
                    ], raw[conns], versus)


# ------------------------------------------------------------------------------------------- large, longtail

def large(args):
    perf.stream(args)


def longtail(args):
    for n in [100_000] + ([1_000_000] if args.million else []):
        args.objects = n
        started = time.time()
        perf.longtail(args)
        log(f"longtail {n}: {time.time() - started:.0f} s")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    perf.binary_flags(ap)
    ap.add_argument("--only", default=",".join(WORKLOADS), help="workloads to run, comma-separated")
    ap.add_argument("--targets", default="lacquer,nginx,varnish,ceiling",
                    help="hits and misses: targets, comma-separated, among " + ", ".join(PORTS)
                    + " (the -plain ones: NGINX with no gzip, Varnish with the default VCL)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds per measurement")
    ap.add_argument("--seconds", type=int, default=6, help="hits and misses: each wrk run (and each profile)")
    ap.add_argument("--wrk-threads", type=int, default=1, help="wrk -t (issue 25 measured with 1)")
    ap.add_argument("--miss-conns", default="50,500", help="misses: connection counts, comma-separated")
    ap.add_argument("--nginx-gzip-level", type=int, default=1, help="gzip_comp_level (NGINX's default is 1)")
    ap.add_argument("--profile", action="store_true",
                    help="flame graphs of lacquerd for one identity-hit run, one gzip-hit run and one miss run")
    ap.add_argument("--profile-inline", action="store_true",
                    help="profiles show inlined functions as frames of their own (minutes more per profile)")
    ap.add_argument("--profile-dir", default=f"{ROOT}/bench/profiles", help="where --profile writes its SVGs")
    ap.add_argument("--workdir", default=None, help="where the stores go (default: the system's temporary dir)")
    ap.add_argument("--million", action="store_true", help="longtail: also 1 000 000 objects (long: see README)")
    ap.add_argument("--longtail-rate", type=int, default=2000)
    ap.add_argument("--longtail-seconds", type=int, default=20)
    ap.add_argument("--stream-mib", type=int, default=200, help="large: the disk-tier body's size")
    ap.add_argument("--stream-reads", type=int, default=5, help="large: full reads per target and client count")
    ap.add_argument("--range-seconds", type=int, default=8, help="large: each oha run of the 64 KiB range p99")
    args = ap.parse_args()
    only = args.only.split(",")
    for w in only:
        if w not in WORKLOADS:
            raise SystemExit(f"unknown workload {w}; known: {', '.join(WORKLOADS)}")
    args.target_list = args.targets.split(",")
    unknown = [t for t in args.target_list if t not in PORTS]
    if unknown or "lacquer" not in args.target_list:
        raise SystemExit(f"--targets must name lacquer and only these: {', '.join(PORTS)}")
    args.miss_conns = [int(c) for c in args.miss_conns.split(",")]
    perf.check_binaries(args, ["lacquerd", "origin"] + (["ceiling"] if "ceiling" in args.target_list else []))
    for tool in ["wrk", "curl"] + (["oha"] if {"large", "longtail"} & set(only) else []):
        if not shutil.which(tool):
            raise SystemExit(f"{tool} is not installed (bench/run installs it)")
    args.scripts = tempfile.mkdtemp(prefix="lacquer-hotpath-lua-")
    for name, text in SCRIPTS.items():
        with open(f"{args.scripts}/{name}.lua", "w") as f:
            f.write(text)
    args.detach_cleanup = True
    print(f"lacquerd: {args.lacquerd}; {time.strftime('%Y-%m-%d %H:%M')}; load: {sh(['uptime']).strip()}")
    try:
        for w in WORKLOADS:
            if w in only:
                started = time.time()
                log(f"--- {w}")
                globals()[w](args)
                log(f"--- {w}: {time.time() - started:.0f} s")
    finally:
        shutil.rmtree(args.scripts, ignore_errors=True)
        log(f"work directories removed {perf.wait_cleanups():.0f} s after the last measurement")


if __name__ == "__main__":
    main()
