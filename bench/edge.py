#!/usr/bin/env python3
"""The edge side by side: hits over TLS (lacquerd's own TLS, Varnish behind hitch, NGINX's TLS), over HTTP/2,
with a TLS handshake per request, and behind HAProxy sending PROXY v2 to each. Every round runs every test
against every target, rotating the order; only ratios from the same run mean anything on a 2-core machine."""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import urllib.request

from compare import CONTROL_PORT, ORIGIN_PORT, ROOT, nginx_conf, oha_json, sh, stop, wait_port

NAMES = ["lacquer", "varnish", "nginx"]
PLAIN = {"lacquer": 8981, "varnish": 8982, "nginx": 8983}
TLS = {"lacquer": 8441, "varnish": 8442, "nginx": 8443}
HAPROXY = {"lacquer": 8461, "varnish": 8462, "nginx": 8463}
PROXY_IN = {"lacquer": 8471, "varnish": 8452, "nginx": 8473}


def certificate(work):
    """One ECDSA P-256 certificate for everyone, as a chain file, a key file and hitch's combined PEM."""
    cert, key = f"{work}/cert.pem", f"{work}/key.pem"
    sh(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", key, "-out", cert, "-days", "2", "-subj", "/CN=bench.test",
        "-addext", "subjectAltName=DNS:bench.test,IP:127.0.0.1"])
    with open(f"{work}/hitch.pem", "w") as f:
        f.write(open(cert).read() + open(key).read())
    return cert, key


def start(work, procs):
    cert, key = certificate(work)
    procs.append(subprocess.Popen([f"{ROOT}/target/release/bench-origin", str(ORIGIN_PORT), str(CONTROL_PORT)]))
    config = f"{work}/lacquer.toml"
    with open(config, "w") as f:
        f.write(f"""
[[listen]]
address = "127.0.0.1:{PLAIN['lacquer']}"
[[listen]]
address = "127.0.0.1:{TLS['lacquer']}"
tls = [{{ cert = "{cert}", key = "{key}" }}]
[[listen]]
address = "127.0.0.1:{PROXY_IN['lacquer']}"
proxy_protocol = true
""")
    procs.append(subprocess.Popen(
        [f"{ROOT}/target/release/lacquerd", "--config", config, "--admin", "127.0.0.1:8991",
         "--backend", f"127.0.0.1:{ORIGIN_PORT}", "--disk", f"{work}/lacquer", "--memory", "256MiB",
         "--disk-size", "2GiB"],
        env={**os.environ, "RUST_LOG": "warn"}))
    vcl = f"{work}/bench.vcl"
    with open(vcl, "w") as f:
        f.write(f'vcl 4.1;\nbackend origin {{ .host = "127.0.0.1"; .port = "{ORIGIN_PORT}"; }}\n')
    # hitch and HAProxy both reach Varnish on its PROXY listener, as the Varnish documentation sets them up.
    procs.append(subprocess.Popen(
        ["/usr/sbin/varnishd", "-F", "-j", "none", "-n", f"{work}/varnish",
         "-a", f"127.0.0.1:{PLAIN['varnish']}", "-a", f"127.0.0.1:{PROXY_IN['varnish']},PROXY",
         "-p", "feature=+http2", "-f", vcl, "-s", "malloc,256m", "-T", "127.0.0.1:8992"],
        stdout=subprocess.DEVNULL))
    procs.append(subprocess.Popen(
        ["hitch", "--user=nobody", "--daemon=off", f"--frontend=[127.0.0.1]:{TLS['varnish']}",
         f"--backend=[127.0.0.1]:{PROXY_IN['varnish']}", "--write-proxy-v2", "--workers=2",
         "--alpn-protos=h2,http/1.1", f"{work}/hitch.pem"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    conf = nginx_conf(work, f"""listen 127.0.0.1:{PLAIN['nginx']};
        listen 127.0.0.1:{TLS['nginx']} ssl http2;
        listen 127.0.0.1:{PROXY_IN['nginx']} proxy_protocol;
        set_real_ip_from 127.0.0.1;
        real_ip_header proxy_protocol;
        ssl_certificate {cert};
        ssl_certificate_key {key};""")
    procs.append(subprocess.Popen(["/usr/sbin/nginx", "-c", conf, "-p", work], stdout=subprocess.DEVNULL))
    haproxy = f"{work}/haproxy.cfg"
    with open(haproxy, "w") as f:
        f.write("global\n    nbthread 2\ndefaults\n    mode tcp\n    timeout connect 5s\n"
                "    timeout client 60s\n    timeout server 60s\n")
        for name in NAMES:
            f.write(f"listen {name}\n    bind 127.0.0.1:{HAPROXY[name]}\n"
                    f"    server s 127.0.0.1:{PROXY_IN[name]} send-proxy-v2\n")
    procs.append(subprocess.Popen(["haproxy", "-db", "-f", haproxy], stdout=subprocess.DEVNULL))
    wait_port(ORIGIN_PORT)
    for ports in [PLAIN, HAPROXY]:
        for port in ports.values():
            wait_port(port)


def url(scheme, port):
    return f"{scheme}://127.0.0.1:{port}/obj/2k"


def ttfb(args):
    """(p50, p99) time to first byte in ms, and the share of answers that were 200."""
    data = oha_json(["--insecure", "--latency-correction"] + args)
    codes = data["statusCodeDistribution"]
    ok = codes.get("200", 0) / max(sum(codes.values()), 1)
    p = data["firstBytePercentiles"]
    return p["p50"] * 1000, p["p99"] * 1000, ok


def wrk_rps(target_url, seconds):
    out = sh(["wrk", "-t2", "-c100", f"-d{seconds}s", target_url])
    for line in out.splitlines():
        if line.startswith("Requests/sec:"):
            return float(line.split()[1])
    raise RuntimeError(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=8, help="duration of each load run")
    ap.add_argument("--rate", type=int, default=5000, help="request rate of the latency tests")
    ap.add_argument("--handshake-rate", type=int, default=500,
                    help="request rate with a new TLS connection per request")
    args = ap.parse_args()
    s, rate = str(args.seconds), str(args.rate)
    tests = {
        "plain": lambda t: ttfb(["-z", f"{s}s", "-q", rate, "-c", "50", url("http", PLAIN[t])]),
        "tls": lambda t: ttfb(["-z", f"{s}s", "-q", rate, "-c", "50", url("https", TLS[t])]),
        "h2": lambda t: ttfb(["-z", f"{s}s", "-q", rate, "-c", "10", "-p", "5", "--http2",
                              url("https", TLS[t])]),
        "handshake": lambda t: ttfb(["-z", f"{s}s", "-q", str(args.handshake_rate), "-c", "20",
                                     "--disable-keepalive", url("https", TLS[t])]),
        "proxy_v2": lambda t: ttfb(["-z", f"{s}s", "-q", rate, "-c", "50", url("http", HAPROXY[t])]),
    }
    work = tempfile.mkdtemp(prefix="lacquer-edge-")
    procs = []
    raw = {t: {} for t in NAMES}
    try:
        start(work, procs)
        for t in NAMES:
            for _ in range(3):
                urllib.request.urlopen(url("http", PLAIN[t])).read()
        for r in range(args.rounds):
            order = NAMES[r % 3:] + NAMES[:r % 3]
            for t in order:
                res = raw[t]
                for name, run in tests.items():
                    p50, p99, ok = run(t)
                    res.setdefault(f"{name}_p50", []).append(p50)
                    res.setdefault(f"{name}_p99", []).append(p99)
                    res.setdefault(f"{name}_ok", []).append(ok)
                res.setdefault("tls_rps", []).append(wrk_rps(url("https", TLS[t]), args.seconds))
                print(f"round {r + 1} {t}: " + ", ".join(f"{k} {v[-1]:.2f}" for k, v in res.items()),
                      file=sys.stderr)
    finally:
        stop(procs, work)

    med = {t: {k: statistics.median(v) for k, v in r.items()} for t, r in raw.items()}
    rows = [
        (f"plain HTTP/1.1 TTFB p99 at {rate} rps (ms)", "plain_p99", "{:.2f}"),
        (f"TLS HTTP/1.1 TTFB p50 at {rate} rps (ms)", "tls_p50", "{:.2f}"),
        (f"TLS HTTP/1.1 TTFB p99 at {rate} rps (ms)", "tls_p99", "{:.2f}"),
        (f"TLS HTTP/2 TTFB p99 at {rate} rps (ms)", "h2_p99", "{:.2f}"),
        (f"TLS handshake per request, TTFB p99 at {args.handshake_rate} rps (ms)", "handshake_p99", "{:.2f}"),
        (f"behind HAProxy send-proxy-v2, TTFB p99 at {rate} rps (ms)", "proxy_v2_p99", "{:.2f}"),
        ("TLS HTTP/1.1 max rps (wrk, 100 conn)", "tls_rps", "{:.0f}"),
    ]
    print(f"\nmedian of {args.rounds} rounds; Varnish's TLS is hitch (PROXY v2 to Varnish); "
          "ratio = lacquer / other (for rps higher is better, else lower)\n")
    print("| metric | lacquer | varnish | nginx | vs varnish | vs nginx |")
    print("|---|---|---|---|---|---|")
    for label, key, fmt in rows:
        lq, vn, nx = med["lacquer"][key], med["varnish"][key], med["nginx"][key]
        ratio = lambda a, b: f"{a / b:.2f}" if b else "-"
        print(f"| {label} | {fmt.format(lq)} | {fmt.format(vn)} | {fmt.format(nx)} | {ratio(lq, vn)} "
              f"| {ratio(lq, nx)} |")
    bad = {t: {k: v for k, v in med[t].items() if k.endswith("_ok") and v < 1} for t in NAMES}
    if any(bad.values()):
        print(f"\nshare of 200 answers below 1: {bad}")


if __name__ == "__main__":
    main()
