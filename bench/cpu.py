#!/usr/bin/env python3
"""CPU per request, the measure that holds on a shared 2-core machine where rates swing with the neighbours:
each target runs one worker pinned to core 0, wrk (-t1) and bench-origin run on core 1, and the target's
process CPU (user + system, all its processes, /proc/PID/stat) is divided by the requests wrk completed.
Medians over rounds, targets interleaved and their order rotated between rounds.

    python3 bench/cpu.py                       # lacquerd (target/release), NGINX, Varnish, the ceiling; 3 rounds
    python3 bench/cpu.py --lacquerd before=/tmp/old/lacquerd --lacquerd after=target/release/lacquerd
    python3 bench/cpu.py --only hit-identity,miss --perf bench/profiles     # and flame graphs of lacquerd

Targets, each with one worker on core 0 (`taskset -c 0`):
  every --lacquerd NAME=PATH (repeatable; default `lacquer=` $LACQUERD, else $BENCH_BIN/lacquerd, else
          target/release/lacquerd; $LACQUERD may also hold NAME=PATH words): `[server] workers = 1`,
          `--memory 256MiB --disk-size 1GiB`
  nginx   one worker, proxy_cache on disk with the lock, the gzip filter as bench/hotpath.py configures it
          (gzip_comp_level 1, gunzip), `proxy_force_ranges on` (as bench/perf.py: ranges from the cache
          whether or not the origin sent Accept-Ranges) and X-Cache-Status; --no-nginx leaves it out
  varnish `-s malloc,256m -p thread_pools=1`, bench/hotpath.py's VCL (`beresp.do_gzip` for text, as Varnish's
          users guide shows; http_gzip_support on); --no-varnish leaves it out
  ceiling bench-ceiling with one thread: bare hyper answering every request with the same 2048 bytes. Only on
          the manifest hits, whose identity body is those 2048 bytes (it ignores Accept-Encoding: the gzip row
          compares everyone's gzip with its identity). --no-ceiling leaves it out

Workloads (--only, comma-separated):
  hit-identity        the 2 KiB HLS manifest (`/hls/...`), no Accept-Encoding, 100 connections
  hit-gzip            the same with `Accept-Encoding: gzip, deflate, br`
  hit-page-identity   the 200 KiB HTML page (`/page/front.html`), no Accept-Encoding, 100 connections
  hit-page-gzip       the same with `Accept-Encoding: gzip, deflate, br`
  miss                every request a new 1 KiB URL (`/new/...`), 50 connections
  hit-4mib            a 4 MiB object, `/range/4194304/cpu`, 10 connections. bench-origin serves it as a file
                      server does (Content-Length, ETag, Accept-Ranges); not `/obj/4m`, which it sends
                      chunked: NGINX cannot serve a range of a cached body of unknown length
  range-64k           `Range: bytes=1048576-1114111` (64 KiB in the middle) of that object, stored whole by
                      the warm-up, 20 connections; a 206 from the cache is expected
  esi                 an 8 KiB page with three ESI includes of 1 KiB blocks (`/esi/page`, as Magento's pages
                      with its page cache set to Varnish), every part stored, assembled for each request,
                      identity client, 100 connections; lacquerd (`esi = true` on `/esi/`) and Varnish
                      (`beresp.do_esi` on `/esi/`) only: NGINX has no ESI

Before the rounds every hit workload is warmed on every target (three requests of the whole object, then
three as the workload sends them) and one more request is checked: the status (206 for the range, else 200),
the coding, the size and the target's own hit marker (lacquerd `X-Cache: HIT`, NGINX `X-Cache-Status: HIT`,
Varnish two ids in `X-Varnish`); the table of what each target served is printed, with a warning for any
answer that was not a hit. Each measured hit run follows one second of the same load at 10 connections.
wrk runs with `--timeout 10s`; errors it reports are printed and listed again under the table.

--perf DIR: after the rounds, one more run of hit-identity and of miss (and of esi, when it is among --only) per
lacquerd target under
`perf record -F 499 --call-graph dwarf` (the release build has debug info but no frame pointers, so `-g`'s
frame-pointer stacks would be broken), turned into DIR/NAME-WORKLOAD.svg flame graphs (inferno-flamegraph
when installed, else flamegraph.pl, else bench/flame.py's own SVG), DIR/NAME-WORKLOAD.folded (the folded
stacks, for any flame-graph tool) and DIR/NAME-WORKLOAD.txt (`perf report --stdio`: the hottest symbols by
self time, by shared object, and including callees). Those runs are not counted in the table.

Ports: origin 8980 (control 8979), lacquerd 8971-8974 (admin 8961-8964), NGINX 8975, Varnish 8976 (admin
8977), ceiling 8978."""

import argparse
import http.client
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import flame  # noqa: E402
import perf  # noqa: E402
from compare import CONTROL_PORT, ORIGIN_PORT, cpu_seconds, nginx_conf, sh, wait_port  # noqa: E402
from hotpath import NGINX_GZIP, VCL_GZIP, WRK_NEW_URLS, WRK_REPORT  # noqa: E402

MANIFEST = "/hls/channel-7/720p.m3u8"
PAGE = "/page/front.html"
# 4 MiB as a file server serves it (Content-Length, ETag, Last-Modified, Accept-Ranges). Not /obj/4m: bench-origin
# sends that chunked, and NGINX cannot serve a range of a cached body whose length it was never told (it answers
# the whole 4 MiB with a 200, even with proxy_force_ranges).
LARGE = "/range/4194304/cpu"
GZIP = {"Accept-Encoding": "gzip, deflate, br"}
RANGE = {"Range": "bytes=1048576-1114111"}
# name: (path, request headers, connections, wrk script, whether the ceiling is a fair comparison)
WORKLOADS = {
    "hit-identity": (MANIFEST, {}, 100, "report", True),
    "hit-gzip": (MANIFEST, GZIP, 100, "report", True),
    "hit-page-identity": (PAGE, {}, 100, "report", False),
    "hit-page-gzip": (PAGE, GZIP, 100, "report", False),
    "miss": ("/new/", {}, 50, "new-urls", False),
    "hit-4mib": (LARGE, {}, 10, "report", False),
    "range-64k": (LARGE, RANGE, 20, "report", False),
    "esi": ("/esi/page", {}, 100, "report", False),
}
# Workloads NGINX cannot serve as the others do: it has no ESI.
NOT_NGINX = {"esi"}
FIXED = ("nginx", "varnish", "ceiling")
# The `esi` workload's pages: parsed for ESI, as a `[[route]] esi = true` does for lacquerd.
VCL_ESI = """
sub vcl_backend_response {
    if (bereq.url ~ "^/esi/") {
        set beresp.do_esi = true;
    }
}
"""
NGINX_PORT, VARNISH_PORT, VARNISH_ADMIN, CEILING_PORT = 8975, 8976, 8977, 8978


def pinned(core, cmd, **kw):
    return subprocess.Popen(["taskset", "-c", str(core), *cmd], **kw)


WRK_ERRORS = []


def wrk(scripts, port, path, conns, seconds, headers, script, run):
    """Requests completed by one wrk run on core 1. Errors (a timeout is a request that took over 10 s) are
    reported, and listed again under the table; the run still counts: CPU per completed request."""
    cmd = ["taskset", "-c", "1", "wrk", "-t1", f"-c{conns}", f"-d{seconds}s", "--timeout", "10s",
           "-s", f"{scripts}/{script}.lua"]
    for name, value in headers.items():
        cmd += ["-H", f"{name}: {value}"]
    cmd += [f"http://127.0.0.1:{port}{path}"]
    if script == "new-urls":
        cmd += ["--", f"/new/{port}-{run}-"]
    for line in sh(cmd).splitlines():
        if line.startswith("WRKJSON "):
            res = json.loads(line[len("WRKJSON "):])
            errors = {k: res[k] for k in ("connect", "read", "write", "status", "timeout") if res[k]}
            if errors:
                WRK_ERRORS.append(f"wrk -c{conns} on {port}{path} {headers or ''}: errors {errors} in "
                                  f"{res['requests']} requests")
                print(f"WARNING: {WRK_ERRORS[-1]}", flush=True)
            if not res["requests"]:
                raise RuntimeError(f"no request completed on {port}{path}: {res}")
            return res["requests"]
    raise RuntimeError("no report from wrk")


def fetch(port, path, headers):
    """(status, lower-case headers, body) of one GET on a fresh connection with exactly `headers` (no
    Accept-Encoding unless given, as wrk)."""
    con = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        con.putrequest("GET", path, skip_accept_encoding=True)
        for name, value in headers.items():
            con.putheader(name, value)
        con.endheaders()
        resp = con.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        con.close()


def is_hit(kind, headers):
    if kind == "lacquer":
        return headers.get("x-cache") == "HIT"
    if kind == "varnish":
        return len(headers.get("x-varnish", "").split()) == 2
    if kind == "nginx":
        return headers.get("x-cache-status") == "HIT"
    return None  # the ceiling caches nothing


def lacquerd_builds(given):
    """{name: path} from --lacquerd NAME=PATH, else $LACQUERD (a path, or NAME=PATH words), else the default
    build (perf.binary: $BENCH_BIN/lacquerd, else target/release/lacquerd)."""
    items = given or [w for w in os.environ.get("LACQUERD", "").split() if "=" in w]
    if not items:
        items = [f"lacquer={perf.binary('lacquerd', 'LACQUERD')}"]
    builds = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise SystemExit(f"--lacquerd {item}: expected NAME=PATH")
        if name in FIXED or name in builds:
            raise SystemExit(f"--lacquerd {item}: the name {name} is taken")
        if not os.access(path, os.X_OK):
            raise SystemExit(f"--lacquerd {item}: {path} is not an executable")
        builds[name] = path
    if len(builds) > 4:
        raise SystemExit("at most 4 lacquerd builds (ports 8971-8974)")
    return builds


# ------------------------------------------------------------------------------------------------- profiles

def profile(work, pid, out_dir, name, title, load, seconds):
    """perf record of `pid` (on core 1, beside wrk) while `load()` runs; writes out_dir/name.svg, .folded and
    .txt."""
    data = f"{work}/{name}.perf.data"
    rec = subprocess.Popen(["taskset", "-c", "1", "perf", "record", "-F", "499", "--call-graph", "dwarf,16384",
                            "-p", str(pid), "-o", data, "--", "sleep", str(seconds)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.3)
    load()
    rec.wait()
    started = time.time()
    stacks = flame.collapse(flame.perf_script(data))
    folded = f"{out_dir}/{name}.folded"
    flame.write_folded(stacks, folded)
    svg = f"{out_dir}/{name}.svg"
    if shutil.which("inferno-flamegraph"):
        tool = "inferno-flamegraph"
        with open(folded) as f, open(svg, "w") as out:
            subprocess.run(["inferno-flamegraph", "--title", title], stdin=f, stdout=out, check=True)
    elif shutil.which("flamegraph.pl"):
        tool = "flamegraph.pl"
        with open(folded) as f, open(svg, "w") as out:
            subprocess.run(["flamegraph.pl", "--title", title], stdin=f, stdout=out, check=True)
    else:
        tool = "bench/flame.py (no inferno-flamegraph or flamegraph.pl installed)"
        with open(svg, "w") as out:
            out.write(flame.render(stacks, title))
    report = ["perf", "report", "-i", data, "--stdio", "--no-inline"]
    with open(f"{out_dir}/{name}.txt", "w") as f:
        f.write(f"# {title}\n")
        # Self time by symbol and by shared object: where the cycles are spent; then including callees.
        for extra in (["--no-children", "--sort", "symbol", "-g", "none", "--percent-limit", "0.5"],
                      ["--no-children", "--sort", "dso", "-g", "none"],
                      ["--children", "--sort", "symbol", "-g", "none", "--percent-limit", "2"]):
            text = subprocess.run(report + extra, capture_output=True, text=True, errors="replace").stdout
            # perf pads every line to its longest symbol and adds two empty IPC columns: dropped.
            for line in text.splitlines():
                line = re.sub(r"\s+-\s+-\s*$", "", line).rstrip()
                f.write((line[:160].rstrip() if line.startswith("# ") else line) + "\n")
    leaves, total = {}, sum(stacks.values())
    for key, n in stacks.items():
        leaf = key.rsplit(";", 1)[-1]
        leaves[leaf] = leaves.get(leaf, 0) + n
    top = sorted(leaves.items(), key=lambda kv: -kv[1])[:8]
    print(f"profile {svg} ({total} samples, {tool}, {time.time() - started:.0f} s); hottest leaves: "
          + "; ".join(f"{100 * n / max(total, 1):.1f}% {leaf[:70]}" for leaf, n in top), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lacquerd", action="append", default=[],
                    help="NAME=PATH, repeatable (default: lacquer=$LACQUERD, else target/release/lacquerd)")
    ap.add_argument("--origin", default=perf.binary("bench-origin", "BENCH_ORIGIN"),
                    help="bench-origin (default: $BENCH_ORIGIN, $BENCH_BIN/bench-origin, target/release)")
    ap.add_argument("--ceiling", default=perf.binary("bench-ceiling", "BENCH_CEILING"),
                    help="bench-ceiling (default: $BENCH_CEILING, $BENCH_BIN/bench-ceiling, target/release)")
    ap.add_argument("--no-nginx", action="store_true")
    ap.add_argument("--no-varnish", action="store_true")
    ap.add_argument("--no-ceiling", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=5, help="each measured wrk run (and each profile)")
    ap.add_argument("--only", default=",".join(WORKLOADS), help="workloads, comma-separated")
    ap.add_argument("--perf", metavar="DIR",
                    help="flame graphs of every lacquerd target for one more hit-identity and miss run")
    args = ap.parse_args()
    only = args.only.split(",")
    for w in only:
        if w not in WORKLOADS:
            raise SystemExit(f"unknown workload {w}; known: {', '.join(WORKLOADS)}")
    builds = lacquerd_builds(args.lacquerd)
    if not any(WORKLOADS[w][4] for w in only):
        args.no_ceiling = True
    for flag in ["origin"] + ([] if args.no_ceiling else ["ceiling"]):
        if not os.access(getattr(args, flag), os.X_OK):
            raise SystemExit(f"--{flag} {getattr(args, flag)}: not an executable (bench/run builds it)")
    if args.perf:
        if not shutil.which("perf"):
            raise SystemExit("--perf needs perf (apt-get install linux-perf)")
        os.makedirs(args.perf, exist_ok=True)
    work = tempfile.mkdtemp(prefix="lacquer-cpu-")
    scripts = f"{work}/lua"
    os.makedirs(scripts)
    for name, text in (("report", WRK_REPORT), ("new-urls", WRK_NEW_URLS)):
        with open(f"{scripts}/{name}.lua", "w") as f:
            f.write(text)
    procs, ports, kinds = {}, {}, {}
    procs["origin"] = pinned(1, [args.origin, str(ORIGIN_PORT), str(CONTROL_PORT)])
    try:
        for i, (name, path) in enumerate(builds.items()):
            ports[name], kinds[name] = 8971 + i, "lacquer"
            config = f"{work}/{name}.toml"
            with open(config, "w") as f:
                f.write(f'[server]\nworkers = 1\n[[backend]]\naddress = "127.0.0.1:{ORIGIN_PORT}"\n'
                        f'[[listen]]\naddress = "127.0.0.1:{ports[name]}"\n'
                        f'[[route]]\npath_prefix = "/esi/"\nesi = true\n')
            procs[name] = pinned(0, [path, "--config", config, "--admin", f"127.0.0.1:{8961 + i}",
                                     "--disk", f"{work}/{name}", "--memory", "256MiB", "--disk-size", "1GiB"],
                                 env={**os.environ, "RUST_LOG": "warn"})
        if not args.no_nginx:
            extra = ("add_header X-Cache-Status $upstream_cache_status;\n            proxy_force_ranges on;\n"
                     "            " + NGINX_GZIP.format(level=1))
            conf = nginx_conf(work, f"listen 127.0.0.1:{NGINX_PORT};", extra, origin_port=ORIGIN_PORT)
            with open(conf) as f:
                text = f.read().replace("worker_processes 2;", "worker_processes 1;")
            with open(conf, "w") as f:
                f.write(text)
            procs["nginx"] = pinned(0, ["/usr/sbin/nginx", "-c", conf, "-p", work], stdout=subprocess.DEVNULL)
            ports["nginx"], kinds["nginx"] = NGINX_PORT, "nginx"
        if not args.no_varnish:
            vcl = f"{work}/varnish.vcl"
            with open(vcl, "w") as f:
                f.write(f'vcl 4.1;\nbackend origin {{ .host = "127.0.0.1"; .port = "{ORIGIN_PORT}"; }}\n'
                        + VCL_GZIP + VCL_ESI)
            procs["varnish"] = pinned(0, [
                shutil.which("varnishd") or "/usr/sbin/varnishd", "-F", "-j", "none", "-n", f"{work}/varnish",
                "-a", f"127.0.0.1:{VARNISH_PORT}", "-f", vcl, "-s", "malloc,256m", "-T",
                f"127.0.0.1:{VARNISH_ADMIN}", "-p", "thread_pools=1", "-p", "http_gzip_support=on"],
                stdout=subprocess.DEVNULL, stderr=open(f"{work}/varnish.log", "w"))
            ports["varnish"], kinds["varnish"] = VARNISH_PORT, "varnish"
        if not args.no_ceiling:
            procs["ceiling"] = pinned(0, [args.ceiling, str(CEILING_PORT), "1"])
            ports["ceiling"], kinds["ceiling"] = CEILING_PORT, "ceiling"
        wait_port(ORIGIN_PORT)
        for port in ports.values():
            wait_port(port)
        targets = list(ports)

        def case_targets(workload):
            return [t for t in targets if (t != "ceiling" or WORKLOADS[workload][4])
                    and (t != "nginx" or workload not in NOT_NGINX)]

        # Warm every hit workload on every target, then check that one more request is a hit.
        print(f"what each target served after the warm-up: status, coding, body bytes, hit\n\n"
              f"| workload | " + " | ".join(targets) + " |\n" + "|---" * (1 + len(targets)) + "|")
        warnings = []
        for workload in only:
            path, headers, _, script, _ = WORKLOADS[workload]
            if script != "report":
                continue
            cells = []
            for t in targets:
                if t not in case_targets(workload):
                    cells.append("-")
                    continue
                for h in ({}, headers):
                    for _ in range(3):
                        fetch(ports[t], path, h)
                status, resp, body = fetch(ports[t], path, headers)
                hit = is_hit(kinds[t], resp)
                want = 206 if "Range" in headers else 200
                cells.append(f"{status} {resp.get('content-encoding', 'identity')} {len(body)} B"
                             + {True: " hit", False: " NOT HIT", None: ""}[hit])
                if status != want or hit is False:
                    warnings.append(f"WARNING: {t} answered {workload} ({path} {headers or ''}) with {status}"
                                    f"{', not from its cache' if hit is False else ''} after the warm-up "
                                    f"(expected {want} from the cache)")
            print(f"| {workload} | " + " | ".join(cells) + " |")
        print("\n".join([""] + warnings), flush=True)

        results = {}
        print(f"load average at start: {os.getloadavg()}", flush=True)
        for r in range(args.rounds):
            for workload in only:
                path, headers, conns, script, _ = WORKLOADS[workload]
                for t in perf.rotate(case_targets(workload), r):
                    if script == "report":
                        wrk(scripts, ports[t], path, 10, 1, headers, script, r)
                    before = cpu_seconds(procs[t].pid)
                    n = wrk(scripts, ports[t], path, conns, args.seconds, headers, script, r)
                    us = (cpu_seconds(procs[t].pid) - before) * 1e6 / n
                    results.setdefault((workload, t), []).append(us)
                    print(f"round {r + 1} {workload:17} {t:10} {us:8.1f} us CPU/request ({n} requests)",
                          flush=True)
        print(f"load average at end: {os.getloadavg()}\n")

        # One row per workload: medians of µs per request, then medians of the per-round ratios.
        over_nginx = [t for t in targets if t not in ("nginx", "ceiling")] if "nginx" in targets else []
        over_ceiling = [t for t in targets if t != "ceiling"] if "ceiling" in targets else []
        over_varnish = [t for t in targets if kinds[t] == "lacquer"] if "varnish" in targets else []
        print(f"median of {args.rounds} rounds, wrk -t1 -d{args.seconds}s; target CPU (user + system, all its "
              "processes) per request in µs; ratios are medians of per-round ratios (lower is cheaper)\n")
        print("| workload (µs CPU per request) | " + " | ".join(targets) + " |"
              + "".join(f" {t} / nginx |" for t in over_nginx) + "".join(f" {t} / ceiling |" for t in over_ceiling)
              + "".join(f" {t} / varnish |" for t in over_varnish))
        print("|---" * (1 + len(targets) + len(over_nginx) + len(over_ceiling) + len(over_varnish)) + "|")

        def ratio(workload, a, b):
            pairs = [x / y for x, y in zip(results.get((workload, a), []), results.get((workload, b), [])) if y]
            return f"{statistics.median(pairs):.2f}" if pairs else "-"

        for workload in only:
            conns = WORKLOADS[workload][2]
            cells = [f"{statistics.median(results[(workload, t)]):.1f}" if (workload, t) in results else "-"
                     for t in targets]
            cells += [ratio(workload, t, "nginx") for t in over_nginx]
            cells += [ratio(workload, t, "ceiling") for t in over_ceiling]
            cells += [ratio(workload, t, "varnish") for t in over_varnish]
            print(f"| {workload} (-c{conns}) | " + " | ".join(cells) + " |")
        if WRK_ERRORS:
            print("\nwrk reported errors:\n" + "\n".join(f"- {e}" for e in WRK_ERRORS))
        if "ceiling" in targets:
            print("\nThe ceiling answers every request with the same 2048 identity bytes, whatever the client "
                  "accepts: it runs on the manifest hits only.")

        if args.perf:
            print(flush=True)
            for name in builds:
                profiled = (("hit-identity", "hits on the 2 KiB manifest, identity client, -c100"),
                            ("miss", "misses, a new 1 KiB URL per request, -c50"),
                            ("esi", "an ESI page of three stored blocks assembled per request, -c100"))
                for workload, title in [(w, t) for w, t in profiled if w in only or w != "esi"]:
                    path, headers, conns, script, _ = WORKLOADS[workload]
                    if script == "report":
                        wrk(scripts, ports[name], path, 10, 1, headers, script, "warm")
                    profile(work, procs[name].pid, args.perf, f"{name}-{workload}",
                            f"{name} ({builds[name]}), one worker on one core: {title}",
                            lambda: wrk(scripts, ports[name], path, conns, args.seconds, headers, script,
                                        f"perf-{name}"), args.seconds)
    finally:
        for p in procs.values():
            p.terminate()
        for p in procs.values():
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        time.sleep(0.2)
        subprocess.run(["rm", "-rf", work])


if __name__ == "__main__":
    main()
