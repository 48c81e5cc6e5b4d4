#!/usr/bin/env python3
"""Slicing: a 2 GiB object through lacquerd (a route with `slice = "8MiB"`) and NGINX set up as lancache sets it
up (`slice 8m`, the slice's range in the cache key and sent to the origin), in one run, targets alternating and
their order rotating between rounds. Per round and target, on objects of their own (every cold test is cold):

  full      a cold full read (curl to /dev/null: MB/s, first byte) and the origin bytes it took; a warm full read
            (MB/s); then an untimed full read checked byte for byte; the origin bytes of the last two
  ranges    --range-requests GETs of 64 KiB at random offsets (a fixed seed; one in ten across a slice edge) on a
            cold object, --range-concurrency at once on kept-alive connections: origin bytes per client byte,
            time to first body byte p50/p99
  resume    --resume-clients clients at once, each `Range: bytes=a-` at a random offset, reading --resume-mib
            then hanging up: aggregate MB/s, origin bytes per client byte

Every range answer is checked: status 206, its Content-Range, and every body byte against the origin's pattern
(byte i is i % 251). A wrong answer is printed when it happens and again at the end, and the script exits 1.

`--plain` slices neither: lacquerd's route has no `slice` (a range far into an object not stored is forwarded to the
origin and its 206 stored as a part, `cache.forward_ranges`, the default) and NGINX's /range/ is its plain
proxy_cache (which fetches the whole object for a range, as Varnish does); give it an object both store whole
(`--size-mib 200`: lacquerd's max_object_size is 256 MiB).

`--targets nginx` runs NGINX alone (a lacquerd from before slicing refuses the route; its configuration goes
through `lacquerd --check` first); `--no-slice` runs lacquerd without the slice line (the 2 GiB object is then
over max_object_size and never stored: a control, not a contender).
Binaries: --lacquerd ($LACQUERD) and --origin ($BENCH_ORIGIN), else target/release/."""

import argparse
import http.client
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare import ROOT, stop, wait_port  # noqa: E402
from hotpath import log, print_table  # noqa: E402

# Ports of its own (100 below large.py's), so that it can run beside the other benchmarks.
ORIGIN_PORT, CONTROL_PORT = 8680, 8679
PORTS = {"lacquer": 8681, "nginx": 8683}
ADMIN_PORT = 8692
MiB = 1 << 20
RANGE = 64 * 1024
BLOCK = MiB
PATTERN = bytes(i % 251 for i in range(BLOCK + 251))
WRONG = []


def wrong(target, what):
    WRONG.append(f"{target}: {what}")
    log(f"!!! WRONG ANSWER {target}: {what}")


def lacquer_config(work, args):
    """lacquerd's TOML: loopback listeners, the benchmark's store sizes, and the slicing route (unless
    --no-slice). max_object_size stays at its 256 MiB default: a 2 GiB object is cached only as slices."""
    path = f"{work}/lacquer.toml"
    with open(path, "w") as f:
        f.write(f"""[[listen]]
address = "127.0.0.1:{PORTS['lacquer']}"

[admin]
listen = "127.0.0.1:{ADMIN_PORT}"

[[backend]]
name = "origin"
address = "127.0.0.1:{ORIGIN_PORT}"

[storage]
dir = "{work}/lacquer"
memory = "256MiB"
disk_size = "6GiB"

[[route]]
path_prefix = "/range/"
""")
        if not (args.no_slice or args.plain):
            f.write(f'slice = "{args.slice_mib}MiB"\n')
    return path


def checked_lacquer_config(work, args):
    """lacquer_config's file, validated by lacquerd itself before anything starts."""
    config = lacquer_config(work, args)
    check = subprocess.run([args.lacquerd, "--config", config, "--check"], capture_output=True, text=True)
    if check.returncode:
        hint = "" if args.no_slice or args.plain else " (one from before slicing rejects `slice`: --no-slice, or --targets nginx)"
        raise SystemExit(f"lacquerd --check refused {config}{hint}:\n{check.stdout}{check.stderr}")
    return config


def nginx_config(work, args):
    """NGINX as lancache (github.com/lancachenet/monolithic, overlay/etc/nginx) runs it: sendfile, a cache on
    disk written in place (use_temp_path=off), slices keyed by URI and range, the lock held for a slice's whole
    fetch, fills finished when the client hangs up. Its own writer rather than compare.py's nginx_conf: these
    are http-level settings, and the cache must hold 6 GiB like lacquerd's disk tier (2 GiB would evict the
    object being read). Differences from lancache: the slice size (theirs is 1m by default, CACHE_SLICE_SIZE);
    no per-CDN cache identifier in the key; validity an hour (the origin's max-age) instead of 3560 days; ETag
    kept (lancache hides it for Battle.net; kept, the slice module checks that every slice comes from the same
    object); and no `aio threads`: with Debian 12's NGINX 1.22.1 it hung 3 of about 20 sliced 2 GiB reads here
    for a minute, until send_timeout cut them (none in 24 without it). Everything outside /range/ is
    compare.py's plain proxy_cache, as /range/ is too with --plain."""
    conf = f"{work}/nginx.conf"
    os.makedirs(f"{work}/nginx-cache", exist_ok=True)
    # --plain: /range/ as `location /` (the rest of its block is never reached).
    plain_range = """            proxy_pass http://origin;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_cache bench;
            proxy_cache_lock on;
        }
        location /unreached/ {"""
    with open(conf, "w") as f:
        f.write(f"""
user root;
worker_processes 2;
daemon off;
pid {work}/nginx.pid;
error_log {work}/nginx-error.log warn;
events {{ worker_connections 4096; multi_accept on; use epoll; }}
http {{
    access_log off;
    sendfile on;
    tcp_nopush on;
    tcp_nodelay on;
    keepalive_timeout 65;
    proxy_cache_path {work}/nginx-cache levels=2:2 keys_zone=bench:64m inactive=200d max_size=6g
                     use_temp_path=off;
    upstream origin {{ server 127.0.0.1:{ORIGIN_PORT}; keepalive 64; }}
    server {{
        listen 127.0.0.1:{PORTS['nginx']};
        location / {{
            proxy_pass http://origin;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_cache bench;
            proxy_cache_lock on;
        }}
        location /range/ {{
{plain_range if args.plain else ""}
            slice {args.slice_mib}m;
            proxy_pass http://origin;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Range $slice_range;
            proxy_cache bench;
            proxy_cache_key $uri$slice_range;
            proxy_ignore_headers Expires Cache-Control;
            proxy_cache_valid 200 206 1h;
            proxy_cache_lock on;
            proxy_cache_lock_age 2m;
            proxy_cache_lock_timeout 1h;
            proxy_cache_use_stale error timeout invalid_header updating http_500 http_502 http_503 http_504;
            proxy_cache_revalidate on;
            proxy_ignore_client_abort on;
            proxy_max_temp_file_size 40960m;
        }}
    }}
}}
""")
    return conf


def origin_bytes(path):
    """Body bytes the origin sent for `path`, once the count has stood still for a second: a slice still being
    filled after its client hung up counts too."""
    last, deadline = None, time.time() + 60
    while True:
        n = int(urllib.request.urlopen(f"http://127.0.0.1:{ORIGIN_PORT}/__bytes{path}", timeout=10).read())
        if n == last or time.time() > deadline:
            return n
        last = n
        time.sleep(1)


def read_checked(resp, offset, limit):
    """Reads at most `limit` body bytes of `resp`, which should be the pattern from byte `offset` on: (bytes
    read, offset of the first block that differs or None, when the first body byte came)."""
    got, bad, first = 0, None, None
    while got < limit:
        data = resp.read1(min(BLOCK, limit - got))
        if not data:
            break
        if first is None:
            first = time.perf_counter()
        start = (offset + got) % 251
        if bad is None and data != PATTERN[start:start + len(data)]:
            bad = offset + got
        got += len(data)
    return got, bad, first


def curl_full(target, path, size):
    """One full GET with curl to /dev/null: (MB/s, ms to the first byte)."""
    run = subprocess.run(["curl", "-s", "--max-time", "600", "-o", "/dev/null", "-w",
                          "%{http_code} %{size_download} %{speed_download} %{time_starttransfer}",
                          f"http://127.0.0.1:{PORTS[target]}{path}"], capture_output=True, text=True)
    code, got, speed, ttfb = run.stdout.split()
    if run.returncode or code != "200" or int(got) != size:
        wrong(target, f"full GET {path}: curl exit {run.returncode}, status {code}, {got} of {size} bytes")
    return float(speed) / 1e6, float(ttfb) * 1000


def checked_full(target, path, size):
    """One full GET read through the pattern check (untimed: Python reads slower than curl)."""
    con = http.client.HTTPConnection("127.0.0.1", PORTS[target], timeout=120)
    try:
        con.request("GET", path)
        resp = con.getresponse()
        got, bad, _ = read_checked(resp, 0, size + 1)
        if resp.status != 200 or got != size or bad is not None:
            wrong(target, f"full GET {path}: status {resp.status}, {got} of {size} bytes, first bad byte {bad}")
    finally:
        con.close()


def range_offsets(rng, args, size):
    """Random 64 KiB ranges, one in ten placed across a slice edge (at random offsets only one in
    slice/64 KiB would be)."""
    slice_bytes = args.slice_mib * MiB
    out = []
    for i in range(args.range_requests):
        if i % 10 == 9 and size > slice_bytes:
            out.append(rng.randrange(1, size // slice_bytes) * slice_bytes - rng.randrange(1, RANGE))
        else:
            out.append(rng.randrange(0, size - RANGE + 1))
    return out


def range_gets(target, path, offsets, concurrency, size):
    """`Range: bytes=a-(a+64 KiB-1)` for every offset, from `concurrency` kept-alive connections at once: ms to
    the first body byte of each right answer."""
    todo, lock, ttfb = iter(offsets), threading.Lock(), []

    def client():
        con = None
        while True:
            with lock:
                a = next(todo, None)
            if a is None:
                break
            con = con or http.client.HTTPConnection("127.0.0.1", PORTS[target], timeout=120)
            expect = f"bytes {a}-{a + RANGE - 1}/{size}"
            t0 = time.perf_counter()
            try:
                con.request("GET", path, headers={"Range": f"bytes={a}-{a + RANGE - 1}"})
                resp = con.getresponse()
                if (resp.status, resp.getheader("content-range"), resp.length) != (206, expect, RANGE):
                    # Never read on: a 200 here would be the whole object.
                    wrong(target, f"range {a}: status {resp.status}, Content-Range "
                          f"{resp.getheader('content-range')}, {resp.length} bytes, expected {expect}")
                    con.close()
                    con = None
                    continue
                got, bad, first = read_checked(resp, a, RANGE)
                resp.read()  # http.client sends the next request only once a response has been read to its end
            except (OSError, http.client.HTTPException) as e:
                wrong(target, f"range {a}: {e!r}")
                con.close()
                con = None
                continue
            if got != RANGE or bad is not None:
                wrong(target, f"range {a}: {got} bytes, first bad byte {bad}")
            else:
                with lock:
                    ttfb.append((first - t0) * 1000)
            if resp.will_close:
                con.close()
                con = None
        if con:
            con.close()

    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return ttfb


def resumes(target, path, offsets, nbytes, size):
    """One client per offset, all at once: `Range: bytes=a-`, read `nbytes` checking them, hang up. Returns
    (bytes read, seconds from the first request to the last hang-up)."""
    barrier, lock, spans, total = threading.Barrier(len(offsets)), threading.Lock(), [], [0]

    def client(a):
        con = http.client.HTTPConnection("127.0.0.1", PORTS[target], timeout=120)
        barrier.wait()
        t0 = time.perf_counter()
        try:
            con.request("GET", path, headers={"Range": f"bytes={a}-"})
            resp = con.getresponse()
            expect = f"bytes {a}-{size - 1}/{size}"
            if resp.status != 206 or resp.getheader("content-range") != expect:
                wrong(target, f"resume {a}: status {resp.status}, Content-Range "
                      f"{resp.getheader('content-range')}, expected {expect}")
                return
            got, bad, _ = read_checked(resp, a, nbytes)
            if got != nbytes or bad is not None:
                wrong(target, f"resume {a}: {got} of {nbytes} bytes, first bad byte {bad}")
        except (OSError, http.client.HTTPException) as e:
            wrong(target, f"resume {a}: {e!r}")
            return
        finally:
            con.close()
        with lock:
            spans.append((t0, time.perf_counter()))
            total[0] += got

    threads = [threading.Thread(target=client, args=(a,)) for a in offsets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if not spans:
        return 0, 1
    return total[0], max(e for _, e in spans) - min(s for s, _ in spans)


def percentile(values, p):
    """Nearest rank."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(p / 100 * len(s) + 0.5) - 1))] if s else float("nan")


def one_round(r, target, args, size, res):
    name = f"{r}-{target}"
    full = f"/range/{size}/full-{name}"
    mbs, ttfb = curl_full(target, full, size)
    res.setdefault("cold_mbs", []).append(mbs)
    res.setdefault("cold_ttfb", []).append(ttfb)
    cold = origin_bytes(full)
    res.setdefault("cold_origin", []).append(cold / size)
    res.setdefault("warm_mbs", []).append(curl_full(target, full, size)[0])
    checked_full(target, full, size)
    res.setdefault("warm_origin", []).append((origin_bytes(full) - cold) / MiB)

    ranges = f"/range/{size}/ranges-{name}"
    offsets = range_offsets(random.Random(args.seed * 1000 + r), args, size)
    ttfbs = range_gets(target, ranges, offsets, args.range_concurrency, size)
    res.setdefault("range_origin", []).append(origin_bytes(ranges) / (len(offsets) * RANGE))
    res.setdefault("range_p50", []).append(percentile(ttfbs, 50))
    res.setdefault("range_p99", []).append(percentile(ttfbs, 99))

    resume = f"/range/{size}/resume-{name}"
    nbytes = args.resume_mib * MiB
    rng = random.Random(args.seed * 1000 + 500 + r)
    starts = [rng.randrange(0, size - nbytes + 1) for _ in range(args.resume_clients)]
    got, seconds = resumes(target, resume, starts, nbytes, size)
    res.setdefault("resume_mbs", []).append(got / seconds / 1e6)
    res.setdefault("resume_origin", []).append(origin_bytes(resume) / max(got, 1))
    log(f"round {r + 1} {target}: cold {mbs:.0f} MB/s ({cold / size:.3f} of the object from the origin), warm "
        f"{res['warm_mbs'][-1]:.0f} MB/s; ranges p50 {res['range_p50'][-1]:.1f} ms p99 {res['range_p99'][-1]:.1f} "
        f"ms, {res['range_origin'][-1]:.1f} origin bytes per byte; resume {res['resume_mbs'][-1]:.0f} MB/s, "
        f"{res['resume_origin'][-1]:.2f} origin bytes per byte")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--targets", default="lacquer,nginx", help="comma-separated: lacquer, nginx")
    ap.add_argument("--no-slice", action="store_true", help="lacquerd without `slice` on the route (a control)")
    ap.add_argument("--plain", action="store_true", help="neither slices: lacquerd forwards ranges, NGINX's plain "
                    "proxy_cache fetches the whole")
    ap.add_argument("--size-mib", type=int, default=2048, help="the object's size")
    ap.add_argument("--slice-mib", type=int, default=8, help="lacquerd's `slice` and NGINX's `slice`")
    ap.add_argument("--range-requests", type=int, default=200)
    ap.add_argument("--range-concurrency", type=int, default=20)
    ap.add_argument("--resume-clients", type=int, default=20)
    ap.add_argument("--resume-mib", type=int, default=64, help="what each resuming client reads")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--lacquerd", default=os.environ.get("LACQUERD", f"{ROOT}/target/release/lacquerd"))
    ap.add_argument("--origin", default=os.environ.get("BENCH_ORIGIN", f"{ROOT}/target/release/bench-origin"))
    ap.add_argument("--workdir", default=None, help="where the caches go (default: the system's temporary directory)")
    args = ap.parse_args()
    targets = args.targets.split(",")
    if set(targets) - set(PORTS) or not targets:
        raise SystemExit(f"--targets: choose from {', '.join(PORTS)}")
    size = args.size_mib * MiB
    if size < max(args.resume_mib * MiB, RANGE):
        raise SystemExit("--size-mib must be at least --resume-mib")

    load_start = os.getloadavg()
    log("load average at start: " + " ".join(f"{x:.2f}" for x in load_start))
    work = tempfile.mkdtemp(prefix="lacquer-slice-", dir=args.workdir)
    procs, raw = [], {t: {} for t in targets}
    try:
        lacquer = checked_lacquer_config(work, args) if "lacquer" in targets else None
        procs.append(subprocess.Popen([args.origin, str(ORIGIN_PORT), str(CONTROL_PORT)]))
        wait_port(ORIGIN_PORT)
        probe = urllib.request.Request(f"http://127.0.0.1:{ORIGIN_PORT}/range/1000/probe",
                                       headers={"Range": "bytes=0-9"})
        if urllib.request.urlopen(probe).status != 206:
            raise SystemExit(f"{args.origin} has no /range/ route: rebuild bench-origin")
        if "nginx" in targets:
            procs.append(subprocess.Popen(["/usr/sbin/nginx", "-c", nginx_config(work, args), "-p", work],
                                          stdout=subprocess.DEVNULL))
        if lacquer:
            procs.append(subprocess.Popen([args.lacquerd, "--config", lacquer], env={**os.environ, "RUST_LOG": "warn"}))
        for t in targets:
            wait_port(PORTS[t])
        for r in range(args.rounds):
            for target in targets[r % len(targets):] + targets[:r % len(targets)]:
                one_round(r, target, args, size, raw[target])
    finally:
        stop(procs, work)

    title = f"median of {args.rounds} rounds"
    if "lacquer" in targets:
        if args.plain:
            title += "; no slicing: lacquerd forwards ranges (forward_ranges), NGINX plain proxy_cache"
        elif args.no_slice:
            title += "; lacquerd without slice (control)"
        else:
            title += f"; lacquerd slice {args.slice_mib} MiB"
    if len(targets) > 1:
        title += "; ratios are medians of per-round ratios"
    obj = f"{args.size_mib} MiB"
    rows = [
        (f"cold full read of {obj} (MB/s)", "cold_mbs", "{:.0f}"),
        ("cold full read: first byte (ms)", "cold_ttfb", "{:.1f}"),
        ("cold full read: origin bytes / object size", "cold_origin", "{:.3f}"),
        ("warm full read (MB/s)", "warm_mbs", "{:.0f}"),
        ("warm and checked full reads: origin MiB", "warm_origin", "{:.0f}"),
        (f"{args.range_requests} x 64 KiB ranges, cold, {args.range_concurrency} at once: origin bytes per client "
         "byte", "range_origin", "{:.1f}"),
        ("64 KiB ranges: first byte p50 (ms)", "range_p50", "{:.1f}"),
        ("64 KiB ranges: first byte p99 (ms)", "range_p99", "{:.1f}"),
        (f"{args.resume_clients} clients resuming, {args.resume_mib} MiB each (aggregate MB/s)", "resume_mbs",
         "{:.0f}"),
        ("resuming: origin bytes per client byte", "resume_origin", "{:.2f}"),
    ]
    versus = ["nginx"] if set(targets) == {"lacquer", "nginx"} else []
    print_table(title, targets, rows, raw, versus)
    loads = [" ".join(f"{x:.2f}" for x in load) for load in (load_start, os.getloadavg())]
    print(f"\nload average at start {loads[0]}, at end {loads[1]}")
    if WRONG:
        print(f"\n{len(WRONG)} WRONG ANSWERS:\n" + "\n".join(WRONG[:50]))
        sys.exit(1)


if __name__ == "__main__":
    main()
