#!/usr/bin/env python3
"""What decoding for clients costs lacquerd (issue 24's defects 6 and 7), on the release build: a large text
page stored compressed (lacquerd compresses it, as by default) and read by clients that send no
`Accept-Encoding`, and a brotli body with a 16 MiB window sent compressed by the origin.

- ranges of the decoded page (`bytes=0-99`, `bytes=-1` read whole, `bytes=-1` dropped after 64 KiB, eight
  `bytes=-1` at once): lacquerd's CPU seconds (from /proc), status, bytes received, and `decoded_bytes`;
- stalled readers: N clients each read 16 KiB of the brotli body, then stop reading; lacquerd's resident
  memory before, while they stall and after they leave, how many got 200 and how many 503, and the
  `decode_memory` gauge.

Needs Python's `brotli` (pip install brotli) for the second part; `bench/run --decode` installs it."""

import argparse
import http.server
import json
import os
import random
import socket
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORDS = "the of and to in a is that for it as was with be by on not this are or from at which".split()


def text(size, seed):
    r = random.Random(seed)
    out, n = [], 0
    while n < size:
        line = " ".join(r.choice(WORDS) for _ in range(12)) + ".\n"
        out.append(line)
        n += len(line)
    return "".join(out).encode()[:size]


def serve_origin(port, page, br_body):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_):
            pass

        def do_GET(self):
            if self.path.startswith("/br") and br_body is not None:
                body, extra = br_body, [("Content-Encoding", "br")]
            else:
                body, extra = page, []
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Cache-Control", "max-age=3600")
            self.send_header("Vary", "Accept-Encoding")
            self.send_header("Content-Length", str(len(body)))
            for k, v in extra:
                self.send_header(k, v)
            self.end_headers()
            view = memoryview(body)
            for i in range(0, len(body), 1 << 20):
                self.wfile.write(view[i : i + (1 << 20)])

    class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
        daemon_threads = True
        allow_reuse_address = True

    server = Server(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def stats(admin, secret):
    req = urllib.request.Request(f"http://127.0.0.1:{admin}/v1/stats")
    req.add_header("Authorization", f"Bearer {secret}")
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.load(r)["proxy"]


def exchange(port, path, headers, read_at_most=None):
    """One request on a new connection; (status, body bytes received)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    head = f"GET {path} HTTP/1.1\r\nHost: bench.test\r\nConnection: close\r\n"
    for k, v in headers:
        head += f"{k}: {v}\r\n"
    s.sendall((head + "\r\n").encode())
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    status = int(data.split(b" ", 2)[1]) if data else 0
    got = len(data.split(b"\r\n\r\n", 1)[1]) if b"\r\n\r\n" in data else 0
    while read_at_most is None or got < read_at_most:
        chunk = s.recv(1 << 20)
        if not chunk:
            break
        got += len(chunk)
    s.close()
    return status, got


def measure(pid, admin, secret, what, run):
    before_cpu, before = cpu_seconds(pid), stats(admin, secret)
    start = time.monotonic()
    results = run()
    wall = time.monotonic() - start
    time.sleep(0.5)
    after = stats(admin, secret)
    cpu = cpu_seconds(pid) - before_cpu
    decoded = after.get("decoded_bytes", 0) - before.get("decoded_bytes", 0)
    statuses = sorted({s for s, _ in results})
    received = sum(b for _, b in results)
    print(
        f"{what:<42} status {statuses}  received {received / 2**20:9.2f} MiB  "
        f"decoded {decoded / 2**20:9.2f} MiB  lacquerd CPU {cpu:6.2f} s  wall {wall:5.2f} s",
        flush=True,
    )


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lacquerd", default=os.path.join(ROOT, "target/release/lacquerd"))
    p.add_argument("--size-mib", type=int, default=200, help="the text page (default 200)")
    p.add_argument("--br-mib", type=int, default=17, help="the brotli body, decoded (default 17)")
    p.add_argument("--readers", type=int, default=200, help="stalled readers (default 200)")
    p.add_argument("--port", type=int, default=8960)
    args = p.parse_args()
    origin_port, port, admin = args.port, args.port + 1, args.port + 2

    page = text(args.size_mib << 20, 1)
    try:
        import brotli

        br_body = brotli.compress(text(args.br_mib << 20, 2), quality=5, lgwin=24)
    except ImportError:
        print("no brotli module: the stalled readers are skipped (pip install brotli)", file=sys.stderr)
        br_body = None
    serve_origin(origin_port, page, br_body)

    work = tempfile.mkdtemp(prefix="lacquer-decode-")
    secret = "0123456789abcdef0123456789abcdef"
    with open(os.path.join(work, "secret"), "w") as f:
        f.write(secret)
    os.chmod(os.path.join(work, "secret"), 0o600)
    proc = subprocess.Popen(
        [args.lacquerd, "--backend", f"127.0.0.1:{origin_port}", "--listen", f"127.0.0.1:{port}",
         "--admin", f"127.0.0.1:{admin}", "--disk", os.path.join(work, "store"), "--memory", "512MiB",
         "--disk-size", "2GiB", "--secret", os.path.join(work, "secret")],
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", admin), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        with open("/proc/loadavg") as f:
            print(f"load average at start: {f.read().split()[:3]}")
        print(f"stored: {exchange(port, '/page', [('Accept-Encoding', 'gzip')])}")
        if br_body is not None:
            print(f"stored: {exchange(port, '/br', [('Accept-Encoding', 'br')])}")
        time.sleep(2)
        pid = proc.pid
        measure(pid, admin, secret, "bytes=0-99, identity",
                lambda: [exchange(port, "/page", [("Range", "bytes=0-99")])])
        measure(pid, admin, secret, "bytes=-1, identity, read whole",
                lambda: [exchange(port, "/page", [("Range", "bytes=-1")])])
        measure(pid, admin, secret, "bytes=-1, identity, gone after 64 KiB",
                lambda: [exchange(port, "/page", [("Range", "bytes=-1")], read_at_most=65536)])

        def eight():
            out = []
            threads = [threading.Thread(target=lambda: out.append(
                exchange(port, "/page", [("Range", "bytes=-1")]))) for _ in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            return out

        measure(pid, admin, secret, "8 x bytes=-1 at once, read whole", eight)

        if br_body is not None:
            base = rss_mib(pid)
            sockets, statuses = [], []
            for _ in range(args.readers):
                s = socket.create_connection(("127.0.0.1", port), timeout=30)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
                s.sendall(b"GET /br HTTP/1.1\r\nHost: bench.test\r\n\r\n")
                head = s.recv(16384)
                statuses.append(int(head.split(b" ", 2)[1]) if head else 0)
                sockets.append(s)
            time.sleep(5)
            stalled = rss_mib(pid)
            gauge = stats(admin, secret)
            for s in sockets:
                s.close()
            time.sleep(3)
            after = rss_mib(pid)
            ok, refused = statuses.count(200), statuses.count(503)
            print(
                f"{args.readers} stalled identity readers of {args.br_mib} MiB brotli (16 MiB window): "
                f"{ok} x 200, {refused} x 503; RSS {base:.0f} MiB before, {stalled:.0f} MiB stalled "
                f"(+{stalled - base:.0f}), {after:.0f} MiB after; decode_memory gauge "
                f"{gauge.get('decode_memory', 0) / 2**20:.0f} MiB, decodes_refused {gauge.get('decodes_refused')}",
                flush=True,
            )
    finally:
        proc.terminate()
        proc.wait(timeout=60)


if __name__ == "__main__":
    main()
