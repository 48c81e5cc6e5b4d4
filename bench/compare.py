#!/usr/bin/env python3
"""Runs lacquerd, Varnish (-s malloc) and NGINX (proxy_cache + proxy_cache_lock) side by side in front of
one origin and prints one table of medians and ratios. Every round runs every test against every target,
rotating the order, because 2-core machines are noisy: only ratios from the same run mean anything."""

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ORIGIN_PORT = 8980
CONTROL_PORT = 8979
TARGETS = {"lacquer": 8981, "varnish": 8982, "nginx": 8983}
LARGE = 4 * 1024 * 1024


def tree(pid):
    """`pid` and every process descended from it."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def varnish(work, port, admin_port, origin_port, params=(), stderr=None):
    """Starts varnishd in the foreground on `port` with the default VCL in front of `origin_port`,
    `-s malloc,256m`, its admin on `admin_port` and `params` (`-p name=value`) added; returns the process."""
    vcl = f"{work}/bench.vcl"
    with open(vcl, "w") as f:
        f.write(f'vcl 4.1;\nbackend origin {{ .host = "127.0.0.1"; .port = "{origin_port}"; }}\n')
    args = [shutil.which("varnishd") or "/usr/sbin/varnishd", "-F", "-j", "none", "-n", f"{work}/varnish",
            "-a", f"127.0.0.1:{port}", "-f", vcl, "-s", "malloc,256m", "-T", f"127.0.0.1:{admin_port}"]
    for p in params:
        args += ["-p", p]
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=stderr)


def cpu_seconds(pid):
    """CPU seconds (user and system) that `pid` and its descendants have spent."""
    ticks = 0
    for p in tree(pid):
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout


def wait_port(port, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/obj/2k", timeout=2).read()
            return
        except Exception:
            time.sleep(0.2)
    raise SystemExit(f"nothing answers on port {port}")


def start(work, procs):
    """The origin and the three targets. lacquerd and Varnish accept PURGE from localhost (bench/invalidation.py
    uses it; the other tests never send it)."""
    procs.append(subprocess.Popen([f"{ROOT}/target/release/bench-origin", str(ORIGIN_PORT), str(CONTROL_PORT)]))
    config = f"{work}/lacquer.toml"
    with open(config, "w") as f:
        f.write("[purge]\nhttp_methods = true\n")
    procs.append(subprocess.Popen(
        [f"{ROOT}/target/release/lacquerd", "--config", config, "--listen", f"127.0.0.1:{TARGETS['lacquer']}",
         "--admin", "127.0.0.1:8991", "--backend", f"127.0.0.1:{ORIGIN_PORT}", "--disk", f"{work}/lacquer",
         "--memory", "256MiB", "--disk-size", "2GiB"],
        env={**os.environ, "RUST_LOG": "warn"}))
    vcl = f"{work}/bench.vcl"
    with open(vcl, "w") as f:
        f.write(f'''vcl 4.1;
backend origin {{ .host = "127.0.0.1"; .port = "{ORIGIN_PORT}"; }}
acl local {{ "127.0.0.1"; }}
sub vcl_recv {{
    if (req.method == "PURGE") {{
        if (client.ip ~ local) {{ return (purge); }}
        return (synth(405));
    }}
}}
''')
    procs.append(subprocess.Popen(
        ["/usr/sbin/varnishd", "-F", "-j", "none", "-n", f"{work}/varnish", "-a", f"127.0.0.1:{TARGETS['varnish']}",
         "-f", vcl, "-s", "malloc,256m", "-T", "127.0.0.1:8992"],
        stdout=subprocess.DEVNULL))
    conf = nginx_conf(work, f"listen 127.0.0.1:{TARGETS['nginx']};", "proxy_cache_lock_timeout 30s;")
    procs.append(subprocess.Popen(["/usr/sbin/nginx", "-c", conf, "-p", work], stdout=subprocess.DEVNULL))
    wait_port(ORIGIN_PORT)
    for port in TARGETS.values():
        wait_port(port)


def nginx_conf(work, listen, extra="", origin_port=None):
    """Writes NGINX's configuration: proxy_cache on disk with the lock, upstream keep-alive, 2 workers;
    `listen` (and `extra`) go into the one server block; the upstream is `origin_port`, else ORIGIN_PORT as it
    is when called (scripts on other ports set it). Returns the file's path."""
    origin_port = origin_port or ORIGIN_PORT
    conf = f"{work}/nginx.conf"
    os.makedirs(f"{work}/nginx-cache", exist_ok=True)
    with open(conf, "w") as f:
        f.write(f"""
user root;
worker_processes 2;
daemon off;
pid {work}/nginx.pid;
error_log {work}/nginx-error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    proxy_cache_path {work}/nginx-cache levels=1:2 keys_zone=bench:64m max_size=2g inactive=1h;
    upstream origin {{ server 127.0.0.1:{origin_port}; keepalive 64; }}
    server {{
        {listen}
        location / {{
            proxy_pass http://origin;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_cache bench;
            proxy_cache_lock on;
            {extra}
        }}
    }}
}}
""")
    return conf


def ratio_table(rows, med):
    """A Markdown table of lacquer against Varnish: `rows` are (label, key, format), `med` the medians by
    target and key; the ratio is lacquer / varnish."""
    print("| metric | lacquer | varnish | ratio |")
    print("|---|---|---|---|")
    for label, key, fmt in rows:
        lq, vn = med["lacquer"][key], med["varnish"][key]
        ratio = f"{lq / vn:.2f}" if vn else "-"
        print(f"| {label} | {fmt.format(lq)} | {fmt.format(vn)} | {ratio} |")


def stop(procs, work, remove=True):
    """SIGTERM to everything `start` started, SIGKILL after 30 s, and the work directory removed (unless not
    `remove`)."""
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
    if remove:
        shutil.rmtree(work, ignore_errors=True)


def wrk_rps(port, seconds):
    out = sh(["wrk", "-t2", "-c100", f"-d{seconds}s", f"http://127.0.0.1:{port}/obj/2k"])
    for line in out.splitlines():
        if line.startswith("Requests/sec:"):
            return float(line.split()[1])
    raise RuntimeError(out)


def oha_latency(port, seconds, rate):
    out = sh(["oha", "--no-tui", "--output-format", "json", "-z", f"{seconds}s", "-q", str(rate),
              "--latency-correction", "-c", "50", f"http://127.0.0.1:{port}/obj/2k"])
    data = json.loads(out)
    p = data["latencyPercentiles"]
    return p["p50"] * 1000, p["p99"] * 1000


def oha_json(args):
    return json.loads(sh(["oha", "--no-tui", "--output-format", "json"] + args))


def range_ttfb_p99(port, seconds, rate):
    data = oha_json(["-z", f"{seconds}s", "-q", str(rate), "--latency-correction", "-c", "20",
                     "-H", "Range: bytes=1048576-1114111", f"http://127.0.0.1:{port}/obj/4m"])
    return data["firstBytePercentiles"]["p99"] * 1000


def origin_mode(mode):
    urllib.request.urlopen(f"http://127.0.0.1:{CONTROL_PORT}/mode/{mode}").read()


def flap(port, cycles, seconds):
    """20 objects fresh for 1 s, warmed; then cycles of origin failure (refused, 503, reset), each `seconds`
    long with one healthy second between, while clients ask for the objects at 500 rps. Returns, per mode, the
    share of 200 answers and the p99 latency, and the healthy p99 for comparison."""
    url = f"http://127.0.0.1:{port}/flap/(1?[0-9])"
    for i in range(20):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/flap/{i}").read()
    load = lambda secs: oha_json(["-z", f"{secs}s", "-q", "500", "-c", "20", "--rand-regex-url", url])
    healthy = load(seconds)["latencyPercentiles"]["p99"] * 1000
    out = {}
    for _ in range(cycles):
        for mode in ["refuse", "503", "reset"]:
            origin_mode(mode)
            data = load(seconds)
            origin_mode("ok")
            # oha counts requests still in flight when its time is up as errors: they are not answers.
            errors = {e: n for e, n in data["errorDistribution"].items() if "deadline" not in e}
            total = sum(data["statusCodeDistribution"].values()) + sum(errors.values())
            ok = data["statusCodeDistribution"].get("200", 0)
            entry = out.setdefault(mode, {"ok": 0, "total": 0, "p99": [], "failures": {}})
            entry["ok"] += ok
            entry["total"] += total
            for status, n in data["statusCodeDistribution"].items():
                if status != "200":
                    entry["failures"][status] = entry["failures"].get(status, 0) + n
            for error, n in errors.items():
                entry["failures"][error] = entry["failures"].get(error, 0) + n
            entry["p99"].append(data["latencyPercentiles"]["p99"] * 1000)
            time.sleep(1)
    for mode, e in out.items():
        if e["failures"]:
            print(f"  {port} {mode} failures: {e['failures']}", file=sys.stderr)
    return healthy, {m: (e["ok"] / max(e["total"], 1), statistics.median(e["p99"])) for m, e in out.items()}


def curl_ttfb(port, path, n, rng=None):
    times, status = [], None
    for _ in range(n):
        cmd = ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code} %{time_starttransfer}", f"http://127.0.0.1:{port}{path}"]
        if rng:
            cmd[1:1] = ["-r", rng]
        code, t = sh(cmd).split()
        status = code
        times.append(float(t) * 1000)
    return statistics.median(times), status


def burst(port, ident, clients):
    """Every client opens its own connection at once for the same cold object; oha reports time to first
    byte per request."""
    path = f"/burst/{ident}"
    out = sh(["oha", "--no-tui", "--output-format", "json", "-n", str(clients), "-c", str(clients),
              f"http://127.0.0.1:{port}{path}"])
    data = json.loads(out)
    fetches = int(urllib.request.urlopen(f"http://127.0.0.1:{ORIGIN_PORT}/__count{path}").read())
    complete = data["statusCodeDistribution"].get("200", 0)
    if data["summary"]["totalData"] != complete * LARGE:
        complete = 0
    p = data["firstBytePercentiles"]
    return p["p50"] * 1000, p["p99"] * 1000, fetches, complete


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=8, help="duration of each wrk and oha run")
    ap.add_argument("--rate", type=int, default=5000, help="oha request rate for the latency test")
    ap.add_argument("--clients", type=int, default=200, help="clients in the cold burst")
    ap.add_argument("--flap-cycles", type=int, default=5, help="origin failure cycles (0 skips the test)")
    ap.add_argument("--json", help="also write the raw results here")
    args = ap.parse_args()

    work = tempfile.mkdtemp(prefix="lacquer-bench-")
    procs = []
    try:
        start(work, procs)
        for port in TARGETS.values():
            for path in ["/obj/2k", "/obj/4m"]:
                for _ in range(3):
                    urllib.request.urlopen(f"http://127.0.0.1:{port}{path}").read()
        raw = {t: {} for t in TARGETS}
        names = list(TARGETS)
        for r in range(args.rounds):
            order = names[r % 3:] + names[:r % 3]
            for target in order:
                port = TARGETS[target]
                res = raw[target]
                res.setdefault("rps", []).append(wrk_rps(port, args.seconds))
                p50, p99 = oha_latency(port, args.seconds, args.rate)
                res.setdefault("lat_p50", []).append(p50)
                res.setdefault("lat_p99", []).append(p99)
                t, _ = curl_ttfb(port, "/obj/4m", 30)
                res.setdefault("ttfb_4m", []).append(t)
                t, status = curl_ttfb(port, "/obj/4m", 30, "1048576-1114111")
                res.setdefault("ttfb_range", []).append(t)
                res["range_status"] = status
                res.setdefault("range_p99_500", []).append(range_ttfb_p99(port, args.seconds, 500))
                b50, b99, fetches, complete = burst(port, f"{r}-{target}", args.clients)
                res.setdefault("burst_p50", []).append(b50)
                res.setdefault("burst_p99", []).append(b99)
                res.setdefault("burst_fetches", []).append(fetches)
                res.setdefault("burst_complete", []).append(complete)
                print(f"round {r + 1} {target}: {res['rps'][-1]:.0f} rps, p99 {p99:.2f} ms, burst p99 {b99:.0f} ms "
                      f"({fetches} fetches, {complete}/{args.clients} complete)", file=sys.stderr)
        flaps = {}
        if args.flap_cycles:
            for target in names:
                flaps[target] = flap(TARGETS[target], args.flap_cycles, 3)
                print(f"flap {target}: {flaps[target]}", file=sys.stderr)
    finally:
        stop(procs, work)

    med = {t: {k: statistics.median(v) for k, v in r.items() if isinstance(v, list)} for t, r in raw.items()}
    rows = [
        ("hit-path max rps (wrk, 100 conn, 2 KiB)", "rps", "{:.0f}", True),
        (f"hit-path latency p50 at {args.rate} rps (ms)", "lat_p50", "{:.2f}", False),
        (f"hit-path latency p99 at {args.rate} rps (ms)", "lat_p99", "{:.2f}", False),
        ("4 MiB GET TTFB p50 (ms)", "ttfb_4m", "{:.2f}", False),
        ("64 KiB range GET TTFB p50 (ms)", "ttfb_range", "{:.2f}", False),
        ("64 KiB range TTFB p99 at 500 rps (ms)", "range_p99_500", "{:.2f}", False),
        (f"cold 4 MiB burst, {args.clients} clients, TTFB p50 (ms)", "burst_p50", "{:.0f}", False),
        (f"cold 4 MiB burst, {args.clients} clients, TTFB p99 (ms)", "burst_p99", "{:.0f}", False),
        ("origin fetches per burst", "burst_fetches", "{:.0f}", False),
    ]
    print(f"\nmedian of {args.rounds} rounds; ratio = lacquer / other (for rps higher is better, else lower)\n")
    print(f"| metric | lacquer | varnish | nginx | vs varnish | vs nginx |")
    print(f"|---|---|---|---|---|---|")
    for label, key, fmt, _ in rows:
        l, v, n = med["lacquer"][key], med["varnish"][key], med["nginx"][key]
        ratio = lambda a, b: f"{a / b:.2f}" if b else "-"
        print(f"| {label} | {fmt.format(l)} | {fmt.format(v)} | {fmt.format(n)} | {ratio(l, v)} | {ratio(l, n)} |")
    print("\nrange responses: " + ", ".join(f"{t} {raw[t]['range_status']}" for t in TARGETS))
    if flaps:
        print(f"\norigin flap ({args.flap_cycles} cycles of 3 s per mode, 20 objects with max-age=1, 500 rps):\n")
        print("| target | healthy p99 (ms) | refused: served / p99 | 503: served / p99 | reset: served / p99 |")
        print("|---|---|---|---|---|")
        for target, (healthy, modes) in flaps.items():
            cells = " | ".join(f"{modes[m][0] * 100:.1f} % / {modes[m][1]:.2f} ms" for m in ["refuse", "503", "reset"])
            print(f"| {target} | {healthy:.2f} | {cells} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(raw, f, indent=1)


if __name__ == "__main__":
    main()
