#!/usr/bin/env python3
"""RSS per object beyond the memory tier (issue 25): lacquerd alone with a small memory tier (default 4 MiB),
N objects of 1 KiB from bench-origin's /small/, then a clean restart.

Prints RSS of the empty store, after the fill (everything published durable, idle) and after the restart
(once the index of stored keys is rebuilt), each less the empty store's and divided by N, with the key
index's own figure. Run it at 100 000 and 1 000 000 objects: the bounded parts (hot metadata, sled's page
cache, foyer's flush buffers) weigh less per object the more objects there are; what grows with N is foyer's
disk-tier index, sled's page table and the key index.

    python3 bench/rss.py --objects 1000000                  # binaries as perf.py finds them
    python3 bench/rss.py --objects 100000 --config my.toml  # e.g. another storage.metadata_cache

jemalloc keeps freed pages for `dirty_decay_ms` (10 s) and an idle process does not return them:
`_RJEM_MALLOC_CONF=dirty_decay_ms:0,muzzy_decay_ms:0` in the environment shows live memory. Ports are
perf.py's plus 10 000, so it can run beside another benchmark."""

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from perf import binary_flags, check_binaries, idle_rss_kib, log, names  # noqa: E402

ORIGIN, CONTROL, LISTEN, ADMIN = 18980, 18979, 18981, 18991


def wait_port(port, timeout):
    """Waits until something accepts connections on `port` (the admin API answers 401 without its secret)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"nothing accepts connections on port {port}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    binary_flags(ap)
    ap.add_argument("--objects", type=int, default=100_000, help="one digit followed by zeros")
    ap.add_argument("--memory", default="4MiB", help="memory tier (default 4MiB)")
    ap.add_argument("--config", help="a lacquerd configuration file to start with")
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    check_binaries(args, ["lacquerd", "origin"])
    n = args.objects
    glob = names(n)[0]
    work = tempfile.mkdtemp(prefix="lacquer-rss-", dir=args.workdir)
    store = f"{work}/store"
    disk = f"{max(2, n * 8 // (1 << 20) + 1)}GiB"

    def start():
        cmd = [args.lacquerd, "--listen", f"127.0.0.1:{LISTEN}", "--admin", f"127.0.0.1:{ADMIN}",
               "--backend", f"127.0.0.1:{ORIGIN}", "--disk", store, "--memory", args.memory, "--disk-size", disk]
        if args.config:
            cmd += ["--config", args.config]
        p = subprocess.Popen(cmd, env={**os.environ, "RUST_LOG": "warn"})
        procs.append(p)
        # A new disk tier is allocated before the admin API answers: seconds for a large one.
        wait_port(LISTEN, timeout=120)
        wait_port(ADMIN, timeout=120)
        return p

    def stats():
        secret = open(f"{store}/secret").read().strip()
        req = urllib.request.Request(f"http://127.0.0.1:{ADMIN}/v1/stats",
                                     headers={"authorization": f"Bearer {secret}"})
        return json.loads(urllib.request.urlopen(req, timeout=30).read())["store"]

    def stop(p):
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=120)

    origin = subprocess.Popen([args.origin, str(ORIGIN), str(CONTROL)])
    procs = [origin]
    rows = []
    try:
        wait_port(ORIGIN, timeout=20)
        p = start()
        empty = idle_rss_kib(p.pid)
        stop(p)
        shutil.rmtree(store)
        p = start()
        started = time.time()
        subprocess.run(["curl", "-s", "--no-progress-meter", "-Z", "--parallel-max", "32",
                        f"http://127.0.0.1:{LISTEN}/small/rs/{glob}"], check=True, stdout=subprocess.DEVNULL)
        while (s := stats())["objects_durable"] < s["objects_published"]:
            time.sleep(0.2)
        log(f"rss: filled {s['objects']} objects in {time.time() - started:.0f} s")
        filled = idle_rss_kib(p.pid)
        stop(p)
        p = start()
        while not (s := stats())["key_index_ready"]:
            time.sleep(0.5)
        restarted = idle_rss_kib(p.pid)
        stop(p)
        per = lambda kib: f"{(kib - empty) * 1024 / n:.0f}"  # noqa: E731
        rows = [
            ("RSS, empty store (MiB)", f"{empty / 1024:.1f}"),
            ("RSS after the fill (MiB)", f"{filled / 1024:.1f}"),
            ("  per object, less the empty store's (B)", per(filled)),
            ("RSS after a clean restart, key index rebuilt (MiB)", f"{restarted / 1024:.1f}"),
            ("  per object, less the empty store's (B)", per(restarted)),
            ("key index, `key_index_bytes` per object (B)", f"{s['key_index_bytes'] / n:.1f}"),
        ]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nlacquerd, {n} objects of 1 KiB, memory tier {args.memory}, disk tier {disk}"
          f"{', ' + args.config if args.config else ''}\n")
    print("| measure | value |\n|---|---|")
    for label, value in rows:
        print(f"| {label} | {value} |")


if __name__ == "__main__":
    main()
