#!/usr/bin/env python3
"""Issue 26's benchmark: what 25 typical rules cost on the hit path. Two lacquerd instances in front of one
origin (bench/origin), one without rules and one with RULES below (the recipes of docs/rules.md an operator
would run at once: request rewrites, passes, a redirect, response TTLs, deliver edits, an error page), both
serving the same hits: a 2 KiB HLS manifest and a 200 KiB HTML page, for a client sending no Accept-Encoding
and for one sending `gzip, deflate, br`. A third lacquerd without rules is the control: its ratio to the first is
the noise of the run. Every round runs wrk -t1 -c100 against all three, in an order rotated between rounds; the
ratio is the median of the per-round ratios (with rules / without), and, less noisy, of the ratios to the mean
of the two instances without rules. The target is >= 0.95.

The binaries come from --lacquerd and --origin (defaults: $LACQUERD, $BENCH_ORIGIN, else the two in
$BENCH_BIN, else target/release as bench/run builds them)."""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare import ORIGIN_PORT, ROOT, sh, wait_port  # noqa: E402

CONTROL_PORT = 8979
# `control` is a second lacquerd without rules: its ratio to `plain` is this machine's noise in the same run.
PORTS = {"plain": (8961, 8962), "rules": (8963, 8964), "control": (8965, 8966)}
PATHS = [("manifest", "/hls/channel-7/720p.m3u8"), ("page", "/page/front.html")]
CLIENTS = [("identity", None), ("gzip", "gzip, deflate, br")]

# Twenty-five rules of the kinds docs/rules.md lists, written as an operator's file would hold them: most are
# tried on every request and match few of the benchmark's (as on a real site, where each recipe is for some
# paths), and four act on every benchmark hit (the Host normalised, `Proxy` removed, `X-Served-By` added,
# `Server` and `X-Powered-By` removed).
RULES = """
[[rule]]
name = "host"
normalize_host = true
[[rule]]
name = "httpoxy"
unset_headers = ["proxy", "x-debug-*"]
[[rule]]
name = "tracking-query"
match = { query = ["utm_source", "utm_medium", "gclid", "fbclid"] }
query = { sort = true, drop = ["utm_*", "gclid", "fbclid"] }
[[rule]]
name = "tracking-cookies"
match = { cookies = ["_ga*", "_gid", "__utm*"] }
cookies = { drop = ["_ga*", "_gid", "__utm*"] }
[[rule]]
name = "static"
match = { extensions = ["css", "js", "png", "jpg", "svg", "woff2"] }
strip_cookies = true
[[rule]]
name = "admin"
match = { path_prefix = ["/admin/", "/wp-admin/", "/user/"] }
pass = true
[[rule]]
name = "authorized"
match = { headers = { authorization = "" } }
pass = true
[[rule]]
name = "posts"
match = { methods = ["POST", "PUT", "DELETE"] }
pass = true
[[rule]]
name = "websocket"
match = { headers = { upgrade = "(?i)websocket" } }
pipe = true
[[rule]]
name = "old-host"
match = { hosts = ["old.example.com"], path_regex = "^/(.*)$" }
respond = { status = 301, location = "https://www.example.com/$1" }
[[rule]]
name = "robots"
match = { path_prefix = ["/robots.txt"] }
respond = { body = "User-agent: *\\nDisallow: /admin/\\n" }
[[rule]]
name = "bots"
match = { headers = { "user-agent" = "(?i)(badbot|scrapy|masscan)" } }
respond = { status = 403, body = "denied\\n" }
[[rule]]
name = "purge-acl"
match = { methods = ["PURGE", "BAN"], except_clients = ["127.0.0.0/8", "10.0.0.0/8"] }
respond = { status = 403 }
[[rule]]
name = "alias"
match = { hosts = ["www.example.org"] }
set_headers = { host = "example.org" }
[[rule]]
name = "api-cache-control"
on = "backend_response"
match = { path_prefix = ["/api/"] }
set_headers = { "cache-control" = "max-age=300" }
[[rule]]
name = "not-found"
on = "backend_response"
match = { status = [404] }
ttl = "15s"
[[rule]]
name = "server-errors"
on = "backend_response"
match = { status = ["5xx"] }
store = false
[[rule]]
name = "images"
on = "backend_response"
match = { content_types = ["image/*"] }
ttl_min = "1h"
[[rule]]
name = "large"
on = "backend_response"
match = { larger_than = "512MiB" }
store = false
[[rule]]
name = "served-by"
on = "deliver"
set_headers = { "x-served-by" = "lacquer-1" }
[[rule]]
name = "hide-server"
on = "deliver"
unset_headers = ["server", "x-powered-by"]
[[rule]]
name = "browser-ttl"
on = "deliver"
match = { content_types = ["text/html"] }
set_headers = { "cache-control" = "max-age=60" }
[[rule]]
name = "debug"
on = "deliver"
match = { headers = { "x-debug" = "" }, clients = ["10.0.0.0/8"] }
debug_headers = true
[[rule]]
name = "no-backend"
on = "error"
match = { status = [502, 503, 504] }
respond = { status = 503, body = "<h1>Back soon</h1>\\n", content_type = "text/html; charset=utf-8" }
[[rule]]
name = "hsts"
on = "deliver"
match = { hosts = ["secure.example.com"] }
set_headers = { "strict-transport-security" = "max-age=31536000" }
"""


def binary(name, env, given):
    if given:
        return given
    if os.environ.get(env):
        return os.environ[env]
    if os.environ.get("BENCH_BIN"):
        return os.path.join(os.environ["BENCH_BIN"], name)
    return os.path.join(ROOT, "target", "release", name)


def config(work, name, rules):
    port, admin = PORTS[name]
    text = f"""[[listen]]
address = "127.0.0.1:{port}"
[backend]
address = "127.0.0.1:{ORIGIN_PORT}"
[admin]
listen = "127.0.0.1:{admin}"
[storage]
dir = "{work}/{name}"
memory = "256MiB"
disk_size = "1GiB"
""" + (RULES if rules else "")
    path = f"{work}/{name}.toml"
    with open(path, "w") as f:
        f.write(text)
    return path


def wrk(port, path, header, seconds):
    cmd = ["wrk", "-t1", "-c100", f"-d{seconds}s"]
    if header:
        cmd += ["-H", f"Accept-Encoding: {header}"]
    out = sh(cmd + [f"http://127.0.0.1:{port}{path}"])
    for line in out.splitlines():
        if line.startswith("Requests/sec:"):
            return float(line.split()[1])
    raise RuntimeError(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--lacquerd")
    ap.add_argument("--origin")
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    lacquerd = binary("lacquerd", "LACQUERD", args.lacquerd)
    origin = binary("bench-origin", "BENCH_ORIGIN", args.origin)
    work = tempfile.mkdtemp(prefix="lacquer-rules-", dir=args.workdir)
    procs = [subprocess.Popen([origin, str(ORIGIN_PORT), str(CONTROL_PORT)])]
    try:
        wait_port(ORIGIN_PORT)
        for name in PORTS:
            conf = config(work, name, name == "rules")
            subprocess.run([lacquerd, "--config", conf, "--check"], check=True, stdout=subprocess.DEVNULL)
            procs.append(subprocess.Popen([lacquerd, "--config", conf], env={**os.environ, "RUST_LOG": "warn"}))
        for name, (port, _) in PORTS.items():
            wait_port(port)
            for _, path in PATHS:
                for _, header in CLIENTS:
                    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}",
                                                 headers={"accept-encoding": header} if header else {})
                    for _ in range(3):
                        urllib.request.urlopen(req, timeout=10).read()
        rps = {(n, p, c): [] for n in PORTS for p, _ in PATHS for c, _ in CLIENTS}
        order = list(PORTS)
        for r in range(args.rounds):
            for body, path in PATHS:
                for client, header in CLIENTS:
                    for name in order[r % 3:] + order[:r % 3]:
                        rps[(name, body, client)].append(wrk(PORTS[name][0], path, header, args.seconds))
            print(f"round {r + 1}/{args.rounds} done; load average {os.getloadavg()[0]:.2f}", flush=True)
        print(f"\nload average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        print("\n| hit | client | without rules (rps) | 25 rules (rps) | ratio (median of rounds) | control ratio (noise) "
              "| ratio to both without rules |")
        print("|---|---|---|---|---|---|---|")
        for body, _ in PATHS:
            for client, _ in CLIENTS:
                plain, ruled = rps[("plain", body, client)], rps[("rules", body, client)]
                control = rps[("control", body, client)]
                ratios = [b / a for a, b in zip(plain, ruled)]
                noise = [c / a for a, c in zip(plain, control)]
                # Against the mean of the two instances without rules, whose own difference is the noise.
                both = [b / ((a + c) / 2) for a, b, c in zip(plain, ruled, control)]
                print(f"| {body} | {client} | {statistics.median(plain):.0f} | {statistics.median(ruled):.0f} "
                      f"| {statistics.median(ratios):.3f} | {statistics.median(noise):.3f} "
                      f"| {statistics.median(both):.3f} |")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(work, ignore_errors=True)
        time.sleep(0.1)


if __name__ == "__main__":
    main()
