#!/usr/bin/env python3
"""Compression side by side: lacquerd, Varnish (http_gzip_support, beresp.do_gzip for text) and NGINX (gzip,
gunzip, gzip_vary, proxy_cache; keyed by the raw Accept-Encoding, and the one-copy setup with
`proxy_set_header Accept-Encoding gzip; proxy_ignore_headers Vary;`) in front of one origin serving a 200 KiB
HTML page uncompressed with `Vary: Accept-Encoding`. Per round and target: a new URL, loaded from cold at a
fixed rate by clients sending 10 real Accept-Encoding strings and 20 % identity clients (one `oha` per client
class, all at once); reported are the origin's fetches of that URL, the bytes each coding puts on the wire,
time to first byte, the target's CPU per 1000 responses, and a check that every client class's answer decodes
to the origin's body. Targets rotate between rounds; only ratios from the same run mean anything on these
noisy 2-core machines."""

import argparse
import gzip
import hashlib
import http.client
import http.server
import json
import os
import random
import resource
import socketserver
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare import ROOT, stop, tree  # noqa: E402

ORIGIN_PORT = 8940
TARGETS = {"lacquer": 8941, "varnish": 8942, "nginx": 8943, "nginx-gzip": 8944}
LACQUER_ADMIN = 8945
VARNISH_ADMIN = 8946
PAGE_SIZE = 200 * 1024

# (client class, Accept-Encoding sent or None for no header, share of the requests). Ten strings real clients
# send, in equal shares, and 20 % identity clients: no header at all (Java's HttpURLConnection, curl without
# --compressed, many bots) and `identity` (wget).
CLIENTS = [
    ("chrome", "gzip, deflate, br, zstd", 0.08),  # Chrome 123+, Edge, Opera, Firefox 126+
    ("safari", "gzip, deflate, br", 0.08),  # Safari, Firefox up to 125, Googlebot
    ("ie11", "gzip, deflate", 0.08),  # Internet Explorer 11, Python requests, Bingbot
    ("qvalues", "br;q=1.0, gzip;q=0.8, *;q=0.1", 0.08),
    ("curl8", "deflate, gzip, br, zstd", 0.08),  # curl 8 --compressed
    ("curl7", "deflate, gzip", 0.08),  # older curl --compressed
    ("go", "gzip", 0.08),  # Go net/http, OkHttp, CDNs towards their origins
    ("httpclient", "gzip,deflate", 0.08),  # Apache HttpClient 4, old Firefox
    ("ruby", "gzip;q=1.0,deflate;q=0.6,identity;q=0.3", 0.08),  # Ruby Net::HTTP
    ("axios", "gzip, compress, deflate, br", 0.08),  # axios, oha
    ("none", None, 0.10),
    ("identity", "identity", 0.10),
]

WORDS = """the of and to in a is that for it as was with be by on not he this are or his from at which but have
an they you were her she there been one all we their has would when if so no will more about up out who can its
into than them only other new some could time these two may then first any like now my such make over our even
most me state after also made many did must before back see through way where get much go well your know should
down work year because come people just say each those take day good how long own too little use us very great
still men here life both between old under last never place same another think house while high right might
came off find states since used give against three himself look few general hand school part small american home
during number again around thought went without however public point end become head once course fact upon need
system set every war put form water took program present government thing told possible group large until always
city order away called want eyes something going face far asked interest later show knew though less night early
almost let open enough side case days yet better nothing tell problem toward given why national room young social
light business president help power country next things word looked real line second church seemed certain big
four felt several children service least family development market weather football season report minister
council election police court health energy climate research students university""".split()
SECTIONS = ["world", "politics", "business", "technology", "science", "sport"]


def sentence(r):
    words = [WORDS[min(int(r.paretovariate(1.1)) - 1, len(WORDS) - 1)] if r.random() < 0.6 else r.choice(WORDS)
             for _ in range(r.randint(6, 22))]
    text = " ".join(words)
    return text[0].upper() + text[1:] + r.choice(".....?!")


def page():
    """A news front page of exactly PAGE_SIZE bytes, the same on every run: stories with pseudo-English text
    (Zipf-like word frequencies), responsive images, share buttons with inline SVG. gzip -6 makes it 6.8 times
    smaller, gzip -1 5.8 times, in the range of real HTML."""
    r = random.Random(15)
    out = ['<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
           '<title>Lacquer benchmark: news front page</title>\n<link rel="stylesheet" href="/static/site.css">\n'
           '</head>\n<body>\n<header class="site-header"><nav class="main-nav"><ul>']
    for s in SECTIONS + ["health", "culture", "opinion", "weather"]:
        out.append(f'<li class="nav-item"><a class="nav-link" href="/section/{s}">{s.title()}</a></li>')
    out.append('</ul></nav></header>\n<main id="content">\n')
    size, story = sum(map(len, out)), 0
    tail = ('</main>\n<footer class="site-footer"><p>&copy; 2026 Lacquer benchmark. All rights reserved.</p>'
            '</footer>\n</body>\n</html>\n')
    while True:
        story += 1
        sec = r.choice(SECTIONS)
        title = sentence(r).rstrip(".?!")
        slug = "-".join(title.lower().split()[:6])
        img = f"/img/{sec}/{r.randint(100000, 999999)}"
        sizes = 'sizes="(max-width: 600px) 100vw, 50vw"'
        parts = [
            f'<article class="story story--{sec}" id="story-{story}" data-section="{sec}">\n'
            f'<h2 class="story__title"><a href="/{sec}/2026/11/{r.randint(1, 30):02d}/{slug}-'
            f'{r.randint(10000, 99999)}">{title}</a></h2>\n<p class="story__meta"><span class="byline">By '
            f'{r.choice(WORDS).title()} {r.choice(WORDS).title()}</span> <time datetime="2026-11-'
            f'{r.randint(1, 30):02d}T{r.randint(0, 23):02d}:{r.randint(0, 59):02d}:00Z">{r.randint(1, 59)} '
            'minutes ago</time></p>\n'
        ]
        for _ in range(r.randint(1, 3)):
            parts.append('<p class="story__text">' + " ".join(sentence(r) for _ in range(r.randint(2, 5)))
                         + "</p>\n")
        parts.append(
            f'<figure class="story__media"><picture><source type="image/avif" srcset="{img}-480.avif 480w, '
            f'{img}-960.avif 960w, {img}-1440.avif 1440w" {sizes}><source type="image/webp" srcset="{img}-480.webp '
            f'480w, {img}-960.webp 960w, {img}-1440.webp 1440w" {sizes}><img class="story__image" '
            f'src="{img}-960.jpg" alt="{title}" width="960" height="540" loading="lazy" decoding="async">'
            '</picture></figure>\n<div class="share-bar" role="group" aria-label="Share this story">'
            f'<a class="share-bar__link share-bar__link--mail" href="mailto:?subject=story-{story}" '
            'aria-label="Share by email"><svg class="icon" viewBox="0 0 24 24" aria-hidden="true">'
            '<path d="M2 4h20v16H2z M2 4l10 8 10-8"/></svg></a><a class="share-bar__link share-bar__link--copy" '
            f'href="#story-{story}" aria-label="Copy link"><svg class="icon" viewBox="0 0 24 24" '
            'aria-hidden="true"><path d="M10 14a5 5 0 0 0 7 0l3-3a5 5 0 0 0-7-7l-1 1 M14 10a5 5 0 0 0-7 0l-3 '
            '3a5 5 0 0 0 7 7l1-1"/></svg></a><button class="share-bar__button" type="button" data-action="save" '
            f'data-story="{story}">Save</button></div>\n<ul class="story__related"><li><a href="/{sec}/related/'
            f'{r.randint(1000, 9999)}">{sentence(r)}</a></li></ul>\n</article>\n')
        block = "".join(parts)
        if size + len(block) + len(tail) + 16 > PAGE_SIZE:
            break
        out.append(block)
        size += len(block)
    pad = PAGE_SIZE - size - len(tail) - len("<!--  -->\n")
    out.append("<!-- " + "." * pad + " -->\n" + tail)
    body = "".join(out).encode()
    assert len(body) == PAGE_SIZE, len(body)
    return body


class Origin(http.server.BaseHTTPRequestHandler):
    """`/page/ANY`: the page, cacheable for an hour, `Vary: Accept-Encoding`; identity unless the origin was
    started with --origin-gzip and the request accepts gzip (then gzip -6, as Apache's mod_deflate would).
    `/__count/PATH`: how often PATH was fetched and with which Accept-Encoding values, as JSON."""

    protocol_version = "HTTP/1.1"
    body = b""
    gzipped = b""
    gzip_enabled = False
    lock = threading.Lock()
    fetches = {}

    def log_message(self, *args):
        pass

    def reply(self, status, headers, body, head=False):
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def do_HEAD(self):
        self.do_GET(head=True)

    def do_GET(self, head=False):
        path = self.path
        if path.startswith("/__count/"):
            with self.lock:
                seen = self.fetches.get(path[len("/__count"):], {})
                data = {"fetches": sum(seen.values()), "accept_encoding": seen}
            return self.reply(200, [("Content-Type", "application/json"), ("Cache-Control", "no-store")],
                              json.dumps(data).encode())
        if not path.startswith("/page/"):
            return self.reply(404, [("Cache-Control", "no-store")], b"not here\n", head)
        ae = self.headers.get("Accept-Encoding")
        with self.lock:
            seen = self.fetches.setdefault(path, {})
            seen[str(ae)] = seen.get(str(ae), 0) + 1
        etag = etag_of(self.body)
        headers = [("Content-Type", "text/html; charset=utf-8"), ("Cache-Control", "max-age=3600"),
                   ("Vary", "Accept-Encoding"), ("Last-Modified", "Mon, 30 Nov 2026 12:00:00 GMT")]
        if self.gzip_enabled and "gzip" in accepted(ae):
            return self.reply(200, headers + [("Content-Encoding", "gzip"), ("ETag", f'"{etag}-gzip"')],
                              self.gzipped, head)
        return self.reply(200, headers + [("ETag", f'"{etag}"')], self.body, head)


def serve_origin(port, gzip_enabled):
    Origin.body = page()
    Origin.gzipped = gzip.compress(Origin.body, 6, mtime=0)
    Origin.gzip_enabled = gzip_enabled

    class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
        daemon_threads = True
        allow_reuse_address = True
        request_queue_size = 1024

    Server(("127.0.0.1", port), Origin).serve_forever()


def accepted(ae):
    """The codings an Accept-Encoding value accepts (q > 0; `*` expanded to the codings this benchmark knows;
    identity unless excluded), by RFC 9110 §12.5.3."""
    if ae is None:
        return {"identity"}
    q = {}
    for item in ae.split(","):
        fields = [f.strip() for f in item.split(";")]
        if not fields[0]:
            continue
        weight = 1.0
        for f in fields[1:]:
            if f.lower().startswith("q="):
                try:
                    weight = float(f[2:])
                except ValueError:
                    weight = 0.0
        q[fields[0].lower()] = weight
    star = q.get("*")
    ok = {c for c, w in q.items() if w > 0 and c != "*"}
    if star is not None and star > 0:
        ok |= {c for c in ("gzip", "br", "zstd", "deflate", "identity") if c not in q}
    if q.get("identity", star if star is not None else 1.0) > 0:
        ok.add("identity")
    return ok


def wait_port(port, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/__ready")
            c.getresponse().read()
            return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"nothing answers on port {port}")


def nginx_conf(work, name, port, gzip_level, one_copy):
    """NGINX as an operator sets up compression in front of an uncompressed origin: proxy_cache on disk with
    the lock, upstream keep-alive, 2 workers, `gzip on; gunzip on; gzip_vary on;`. With `one_copy` it asks the
    origin for gzip and ignores Vary, so one copy serves everyone (Maxim Dounin's advice on nginx@nginx.org);
    without it, proxy_cache keys the variants by the raw Accept-Encoding."""
    os.makedirs(f"{work}/{name}-cache", exist_ok=True)
    one = ("proxy_set_header Accept-Encoding gzip;\n            proxy_ignore_headers Vary;" if one_copy else "")
    conf = f"{work}/{name}.conf"
    with open(conf, "w") as f:
        f.write(f"""
user root;
worker_processes 2;
daemon off;
pid {work}/{name}.pid;
error_log {work}/{name}-error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    proxy_cache_path {work}/{name}-cache levels=1:2 keys_zone={name.replace('-', '_')}:64m max_size=2g inactive=1h;
    upstream origin {{ server 127.0.0.1:{ORIGIN_PORT}; keepalive 64; }}
    gzip on;
    gzip_comp_level {gzip_level};
    gzip_vary on;
    gzip_types text/plain text/css text/xml application/json application/javascript application/xml image/svg+xml application/wasm;
    gunzip on;
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://origin;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_cache {name.replace('-', '_')};
            proxy_cache_lock on;
            proxy_cache_lock_timeout 30s;
            {one}
        }}
    }}
}}
""")
    return conf


VCL = """vcl 4.1;
backend origin {{ .host = "127.0.0.1"; .port = "{port}"; }}
sub vcl_backend_response {{
    # Compress text once, before it is stored (Varnish's users guide, "Compression").
    if (!beresp.http.Content-Encoding && beresp.http.Content-Type ~
            "^(text/|application/(json|javascript|xml|wasm)|image/svg\\+xml)") {{
        set beresp.do_gzip = true;
    }}
}}
"""


def start(work, procs, args, names):
    """The origin and the targets in `names`; returns each target's main process id."""
    origin = [sys.executable, os.path.abspath(__file__), "--serve-origin", str(ORIGIN_PORT)]
    procs.append(subprocess.Popen(origin + (["--origin-gzip"] if args.origin_gzip else [])))
    pids = {}
    if "lacquer" in names:
        config = f"{work}/lacquer.toml"
        with open(config, "w") as f:
            f.write(args.lacquer_toml)
        procs.append(subprocess.Popen(
            [args.lacquerd, "--config", config, "--listen", f"127.0.0.1:{TARGETS['lacquer']}",
             "--admin", f"127.0.0.1:{LACQUER_ADMIN}", "--backend", f"127.0.0.1:{ORIGIN_PORT}",
             "--disk", f"{work}/lacquer", "--memory", "256MiB", "--disk-size", "2GiB"],
            env={**os.environ, "RUST_LOG": "warn"}))
        pids["lacquer"] = procs[-1].pid
    if "varnish" in names:
        vcl = f"{work}/compression.vcl"
        with open(vcl, "w") as f:
            f.write(VCL.format(port=ORIGIN_PORT))
        procs.append(subprocess.Popen(
            ["/usr/sbin/varnishd", "-F", "-j", "none", "-n", f"{work}/varnish",
             "-a", f"127.0.0.1:{TARGETS['varnish']}", "-f", vcl, "-s", "malloc,256m",
             "-T", f"127.0.0.1:{VARNISH_ADMIN}", "-p", "http_gzip_support=on"],
            stdout=subprocess.DEVNULL, stderr=open(f"{work}/varnishd.log", "w")))
        pids["varnish"] = procs[-1].pid
    for name, one_copy in (("nginx", False), ("nginx-gzip", True)):
        if name in names:
            conf = nginx_conf(work, name, TARGETS[name], args.nginx_gzip_level, one_copy)
            procs.append(subprocess.Popen(["/usr/sbin/nginx", "-c", conf, "-p", work], stdout=subprocess.DEVNULL))
            pids[name] = procs[-1].pid
    wait_port(ORIGIN_PORT)
    for name in names:
        wait_port(TARGETS[name])
    return pids


def cpu_seconds(pids):
    """User + system CPU of these processes (all their threads), in seconds."""
    ticks = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])
        except (OSError, IndexError):
            pass
    return ticks / os.sysconf("SC_CLK_TCK")


def machine_busy():
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + values[4]
    return sum(values) - idle, sum(values)


def load(port, path, rate, seconds, connections):
    """One `oha` per client class, all at once, each at its share of `rate`, time to first byte with latency
    correction (measured from when each request was due). Returns per class the parsed JSON."""
    procs = {}
    for name, ae, share in CLIENTS:
        cmd = ["oha", "--no-tui", "--output-format", "json", "-z", f"{seconds}s", "-q", f"{rate * share:.1f}",
               "--latency-correction", "-c", str(connections), f"http://127.0.0.1:{port}{path}"]
        cmd += ["--disable-compression"] if ae is None else ["-H", f"Accept-Encoding: {ae}"]
        procs[name] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = {}
    for name, p in procs.items():
        stdout, stderr = p.communicate()
        if p.returncode != 0:
            raise RuntimeError(f"oha for {name} failed: {stderr}")
        out[name] = json.loads(stdout)
    return out


def decode(coding, data):
    if coding in (None, "", "identity"):
        return data
    if coding in ("gzip", "x-gzip"):
        return gzip.decompress(data)
    if coding == "deflate":
        try:
            return zlib.decompress(data)
        except zlib.error:
            return zlib.decompress(data, -15)
    tool = {"br": ["brotli", "-d", "-c"], "zstd": ["zstd", "-d", "-c", "-q"]}.get(coding)
    if tool is None:
        raise ValueError(f"unknown coding {coding}")
    return subprocess.run(tool, input=data, capture_output=True, check=True).stdout


def etag_of(body):
    return hashlib.sha256(body).hexdigest()[:16]


def verify(port, path, body, origin_gzip):
    """One request per client class (twice, on one connection): the status, the coding sent (which the client
    must accept), `Vary` naming Accept-Encoding, the body decoded against the origin's, and a strong ETag only
    on the origin's own bytes (RFC 9110 §8.8.3: a transformed body's must be weak). Returns per class
    (coding, body length, ETag) and a list of problems."""
    originals = {"identity": (body, f'"{etag_of(body)}"')}
    if origin_gzip:
        originals["gzip"] = (gzip.compress(body, 6, mtime=0), f'"{etag_of(body)}-gzip"')
    coding_by_class, problems = {}, []
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    for name, ae, _ in CLIENTS:
        for _ in range(2):
            conn.putrequest("GET", path, skip_accept_encoding=True)
            if ae is not None:
                conn.putheader("Accept-Encoding", ae)
            conn.endheaders()
            resp = conn.getresponse()
            data = resp.read()
            coding = (resp.getheader("Content-Encoding") or "identity").strip().lower()
            vary = (resp.getheader("Vary") or "").lower()
            if resp.status != 200:
                problems.append(f"{name}: status {resp.status}")
                continue
            if coding not in accepted(ae):
                problems.append(f"{name} ({ae!r}): sent {coding}, which it does not accept")
            if "accept-encoding" not in vary and "*" not in vary:
                problems.append(f"{name}: Vary {vary!r} does not name Accept-Encoding")
            length = resp.getheader("Content-Length")
            if length is not None and int(length) != len(data):
                problems.append(f"{name}: Content-Length {length} but {len(data)} bytes")
            try:
                if decode(coding, data) != body:
                    problems.append(f"{name}: {coding} body does not decode to the origin's")
            except Exception as e:  # noqa: BLE001 (a failed decode is what is being reported)
                problems.append(f"{name}: {coding} body does not decode: {e}")
            etag = resp.getheader("ETag")
            if etag and not etag.startswith("W/") and originals.get(coding) != (data, etag):
                problems.append(f"{name}: strong ETag {etag} on a {coding} body that is not the origin's")
            coding_by_class[name] = (coding, len(data), etag)
    conn.close()
    return coding_by_class, problems


def origin_count(path):
    c = http.client.HTTPConnection("127.0.0.1", ORIGIN_PORT, timeout=5)
    c.request("GET", f"/__count{path}")
    return json.loads(c.getresponse().read())


def pooled_percentile(per_class, weights, p):
    """The p-th percentile of the union of several classes' time-to-first-byte samples, from each class's own
    percentiles (oha reports p10 to p99.99): the classes' distribution functions, interpolated linearly
    between the reported points, are mixed by their request counts and inverted by bisection."""
    points = [10, 25, 50, 75, 90, 95, 99, 99.9, 99.99]
    curves = []
    for pct, w in zip(per_class, weights):
        if w == 0 or pct is None:
            continue
        qs = [pct[f"p{x}"] for x in points]
        curves.append(([0.0] + qs, [0.0] + [x / 100 for x in points], w))
    total = sum(w for _, _, w in curves)

    def cdf(x):
        s = 0.0
        for qs, ps, w in curves:
            if x >= qs[-1]:
                f = 1.0
            else:
                f = 0.0
                for i in range(1, len(qs)):
                    if x < qs[i]:
                        span = qs[i] - qs[i - 1]
                        f = ps[i - 1] + (ps[i] - ps[i - 1]) * ((x - qs[i - 1]) / span if span else 1.0)
                        break
            s += w * f
        return s / total

    lo, hi = 0.0, max(qs[-1] for qs, _, _ in curves)
    for _ in range(60):
        mid = (lo + hi) / 2
        if cdf(mid) < p / 100:
            lo = mid
        else:
            hi = mid
    return hi


def run_target(target, pid, path, body, args):
    """A cold URL loaded for --warmup seconds (the fill under load), then measured for --seconds."""
    port = TARGETS[target]
    load(port, path, args.rate, args.warmup, args.connections)
    fetches_warm = origin_count(path)["fetches"]
    pids = tree(pid)
    loadavg = os.getloadavg()[0]
    cpu0, (busy0, all0), oha0 = cpu_seconds(pids), machine_busy(), resource.getrusage(resource.RUSAGE_CHILDREN)
    res = load(port, path, args.rate, args.seconds, args.connections)
    cpu1, (busy1, all1), oha1 = cpu_seconds(pids), machine_busy(), resource.getrusage(resource.RUSAGE_CHILDREN)
    counted = origin_count(path)
    coding, problems = verify(port, path, body, args.origin_gzip)
    out = {"fetches": counted["fetches"], "fetches_measured": counted["fetches"] - fetches_warm,
           "origin_ae": counted["accept_encoding"], "problems": problems,
           "coding": {c: v[0] for c, v in coding.items()}, "etag": {c: v[2] for c, v in coding.items()},
           "machine_busy": (busy1 - busy0) / max(all1 - all0, 1), "loadavg_before": loadavg}
    ok, errors, by_coding = 0, {}, {}
    for name, data in res.items():
        codes = data["statusCodeDistribution"]
        n = codes.get("200", 0)
        ok += n
        for status, k in codes.items():
            if status != "200":
                errors[status] = errors.get(status, 0) + k
        for e, k in data["errorDistribution"].items():
            if "deadline" not in e:  # requests still running when oha's time was up
                errors[e] = errors.get(e, 0) + k
        c = coding.get(name, ("?", 0, None))
        size = data["summary"]["sizePerRequest"] or 0
        if n and abs(size - c[1]) > 0.5:
            problems.append(f"{name}: mean body under load {size:.0f} bytes, sampled {c[0]} body {c[1]}")
        entry = by_coding.setdefault(c[0], {"n": 0, "bytes": 0})
        entry["n"] += n
        entry["bytes"] += data["summary"]["totalData"]
    out["responses"] = ok
    out["rps"] = ok / args.seconds
    out["errors"] = errors
    # Milliseconds of CPU per 1000 responses: the target's processes, and the 12 oha processes for scale.
    out["cpu_per_1000"] = (cpu1 - cpu0) * 1e6 / max(ok, 1)
    oha_cpu = oha1.ru_utime + oha1.ru_stime - oha0.ru_utime - oha0.ru_stime
    out["loadgen_cpu_per_1000"] = oha_cpu * 1e6 / max(ok, 1)
    out["bytes_per_response"] = sum(e["bytes"] for e in by_coding.values()) / max(ok, 1)
    for c, e in by_coding.items():
        out[f"bytes_{c}"] = e["bytes"] / max(e["n"], 1)
        out[f"share_{c}"] = e["n"] / max(ok, 1)
    groups = {"all": list(res)}
    for name in res:
        groups.setdefault(coding.get(name, ("?",))[0], []).append(name)
    out["classes"] = {n: {"coding": coding.get(n, ("?",))[0], "responses": d["statusCodeDistribution"].get("200", 0),
                          "ttfb_p50": (d["firstBytePercentiles"]["p50"] or 0) * 1000,
                          "ttfb_p99": (d["firstBytePercentiles"]["p99"] or 0) * 1000} for n, d in res.items()}
    for group, names in groups.items():
        pct = [res[n]["firstBytePercentiles"] for n in names]
        weights = [res[n]["statusCodeDistribution"].get("200", 0) for n in names]
        if sum(weights):
            out[f"ttfb_{group}_p50"] = pooled_percentile(pct, weights, 50) * 1000
            out[f"ttfb_{group}_p99"] = pooled_percentile(pct, weights, 99) * 1000
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=10, help="measured load per round and target")
    ap.add_argument("--warmup", type=int, default=3, help="load on the cold URL before measuring")
    ap.add_argument("--rate", type=int, default=2000, help="requests per second, all client classes together")
    ap.add_argument("--connections", type=int, default=8, help="connections per client class (12 classes)")
    ap.add_argument("--targets", default=",".join(TARGETS), help="comma-separated subset of " + ",".join(TARGETS))
    ap.add_argument("--nginx-gzip-level", type=int, default=1, help="gzip_comp_level (NGINX's default is 1)")
    ap.add_argument("--origin-gzip", action="store_true", help="the origin answers gzip to clients accepting it")
    ap.add_argument("--lacquerd", default=f"{ROOT}/target/release/lacquerd")
    ap.add_argument("--lacquer-toml", default="", help="lacquerd's configuration file's text (default: empty)")
    ap.add_argument("--json", help="also write the raw results here")
    ap.add_argument("--serve-origin", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_origin:
        serve_origin(args.serve_origin, args.origin_gzip)
        return
    names = [t for t in args.targets.split(",") if t]
    unknown = set(names) - set(TARGETS)
    if unknown:
        ap.error(f"unknown targets {sorted(unknown)}")
    body = page()
    work = tempfile.mkdtemp(prefix="lacquer-compression-")
    procs = []
    raw = {t: [] for t in names}
    try:
        pids = start(work, procs, args, names)
        for r in range(args.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for target in order:
                res = run_target(target, pids[target], f"/page/{target}/{r}", body, args)
                raw[target].append(res)
                print(f"round {r + 1} {target}: {res['fetches']} fetches, {res['rps']:.0f} rps, "
                      f"{res['bytes_per_response']:.0f} B/resp, TTFB p50 {res.get('ttfb_all_p50', 0):.2f} ms "
                      f"p99 {res.get('ttfb_all_p99', 0):.2f} ms, CPU {res['cpu_per_1000']:.0f} ms/1000, machine "
                      f"{res['machine_busy'] * 100:.0f} % busy, errors {res['errors']}, problems {res['problems']}",
                      file=sys.stderr)
    finally:
        stop(procs, work)
    report(raw, names, args, body)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(raw, f, indent=1)


def report(raw, names, args, body):
    def med(target, key):
        values = [r[key] for r in raw[target] if key in r]
        return statistics.median(values) if values else None

    def fmt(v, spec):
        return "-" if v is None else spec.format(v)

    codings = sorted({k[len("bytes_"):] for t in names for r in raw[t] for k in r
                      if k.startswith("bytes_") and k != "bytes_per_response"})
    # (label, key, format, whether lacquer / varnish means anything for it)
    rows = [("origin fetches per object (fill under load + measured)", "fetches", "{:.0f}", True),
            ("origin fetches while measured", "fetches_measured", "{:.0f}", False),
            ("responses per second achieved", "rps", "{:.0f}", True),
            ("body bytes per response, all clients", "bytes_per_response", "{:.0f}", True)]
    rows += [(f"body bytes per {c} response", f"bytes_{c}", "{:.0f}", True) for c in codings]
    rows += [(f"share of responses sent {c}", f"share_{c}", "{:.2f}", False) for c in codings]
    rows += [("TTFB p50, all clients (ms)", "ttfb_all_p50", "{:.2f}", True),
             ("TTFB p99, all clients (ms)", "ttfb_all_p99", "{:.2f}", True)]
    for c in codings:
        rows += [(f"TTFB p50, {c} responses (ms)", f"ttfb_{c}_p50", "{:.2f}", True),
                 (f"TTFB p99, {c} responses (ms)", f"ttfb_{c}_p99", "{:.2f}", True)]
    rows += [("target CPU per 1000 responses (ms)", "cpu_per_1000", "{:.0f}", True),
             ("load generator (12 oha) CPU per 1000 responses (ms)", "loadgen_cpu_per_1000", "{:.0f}", False),
             ("machine CPU busy while measured", "machine_busy", "{:.0%}", False),
             ("load average (1 min) before measuring", "loadavg_before", "{:.2f}", False)]
    print(f"\nmedian of {args.rounds} rounds, {args.rate} rps for {args.seconds} s per round and target after "
          f"{args.warmup} s on the cold URL; page {len(body)} bytes (gzip -6: {len(gzip.compress(body, 6))})\n")
    ratio = {"lacquer", "varnish"} <= set(names)
    print("| metric | " + " | ".join(names) + " |" + (" lacquer / varnish |" if ratio else ""))
    print("|---|" + "---|" * len(names) + ("---|" if ratio else ""))
    for label, key, spec, comparable in rows:
        cells = [fmt(med(t, key), spec) for t in names]
        line = f"| {label} | " + " | ".join(cells) + " |"
        if ratio:
            lq, vn = med("lacquer", key), med("varnish", key)
            line += f" {lq / vn:.2f} |" if comparable and lq is not None and vn else " |"
        print(line)
    def cell(t, name):
        ttfb = [r["classes"][name]["ttfb_p50"] for r in raw[t] if name in r.get("classes", {})]
        return raw[t][-1]["coding"].get(name, "-") + (f" {statistics.median(ttfb):.2f}" if ttfb else "")

    print("\ncoding sent per client class (last round) and its TTFB p50 in ms (median of rounds):\n")
    print("| client | Accept-Encoding | " + " | ".join(names) + " |")
    print("|---|---|" + "---|" * len(names))
    for name, ae, _ in CLIENTS:
        print(f"| {name} | {'(none)' if ae is None else '`' + ae + '`'} | "
              + " | ".join(cell(t, name) for t in names) + " |")
    print("\nfetches per round: " + "; ".join(f"{t} {[r['fetches'] for r in raw[t]]}" for t in names))
    print("Accept-Encoding the origin saw (last round): "
          + "; ".join(f"{t} {raw[t][-1]['origin_ae']}" for t in names))
    for t in names:
        errors = [r["errors"] for r in raw[t] if r["errors"]]
        problems = [p for r in raw[t] for p in r["problems"]]
        if errors:
            print(f"{t} errors: {errors}")
        if problems:
            print(f"{t} problems: {sorted(set(problems))}")
        elif not errors:
            print(f"{t}: every client class's answer decoded to the origin's body, no errors")


if __name__ == "__main__":
    main()
