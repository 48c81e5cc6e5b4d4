#!/usr/bin/env python3
"""The purge and ban stampede: lacquerd against Varnish, side by side in the same run (NGINX open source has
no purge). Per round and target: fill 100 000 small objects; keep a steady hit load on a hot set of 50 of
them; issue one ban matching the other half of all objects (the even ones); report hit-path p50/p99 before,
during and after the lurker's walk, how long the walk took and how many origin fetches the ban caused (none
should: the hot set is spared, so its latency is the ban's cost to hits, not refetches); then send 1000 URL
purges of cold objects within one second under the same hit load.

lacquerd bans `req.url` through its admin API (its lurker handles every ban). Varnish bans
`obj.http.x-url` through varnishadm, the form its lurker can walk, with ban_lurker_age=0 so the walk starts at
once (its default waits 60 s). Purges are HTTP PURGE requests to both."""

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import http.client

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare import TARGETS, ORIGIN_PORT, ratio_table, start, stop, sh  # noqa: E402

TARGETS = {k: v for k, v in TARGETS.items() if k != "nginx"}


def origin_total():
    return int(urllib.request.urlopen(f"http://127.0.0.1:{ORIGIN_PORT}/__total").read())


class Lacquer:
    def __init__(self, work):
        self.secret = open(f"{work}/lacquer/secret").read().strip()

    def admin(self, method, path, body=None):
        req = urllib.request.Request(f"http://127.0.0.1:8991{path}", method=method,
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"authorization": f"Bearer {self.secret}",
                                              "content-type": "application/json"})
        return json.loads(urllib.request.urlopen(req).read())

    def ban_prefix(self, prefix, even_only):
        tail = "[0-9]*[02468]$" if even_only else ""
        self.admin("POST", "/v1/bans", {"expression": f"req.url ~ ^{prefix}{tail}"})

    def lurker_done(self):
        return self.admin("GET", "/v1/stats")["store"]["bans_pending"] == 0

    def settle(self):
        """Waits until everything filled is on disk, so the measurements start from a quiet store."""
        while True:
            store = self.admin("GET", "/v1/stats")["store"]
            if store["objects_durable"] >= store["objects_published"]:
                return
            time.sleep(0.2)


class Varnish:
    def __init__(self, work):
        self.n = f"{work}/varnish"
        self.adm("param.set", "ban_lurker_age", "0")

    def adm(self, *args):
        return sh(["varnishadm", "-n", self.n] + list(args))

    def ban_prefix(self, prefix, even_only):
        tail = "[0-9]*[02468]$" if even_only else ""
        self.spec = f"obj.http.x-url ~ ^{prefix}{tail}"
        self.adm("ban", "obj.http.x-url", "~", f"^{prefix}{tail}")

    def settle(self):
        pass

    def lurker_done(self):
        # A completed ban is flagged C, or dropped from the list once it is the oldest.
        for line in self.adm("ban.list").splitlines():
            if self.spec in line:
                return " C " in f" {line} "
        return True


def fill(port, prefix, count):
    """Requests prefix0 .. prefix(count-1) once each, 32 at a time (curl's URL globbing)."""
    started = time.time()
    subprocess.run(["curl", "-s", "--no-progress-meter", "-Z", "--parallel-max", "32",
                    f"http://127.0.0.1:{port}{prefix}[0-{count - 1}]"], check=True, stdout=subprocess.DEVNULL)
    return time.time() - started


class HotLoad:
    """oha against the hot set (the 50 odd objects below 100, which the ban spares) in back-to-back windows of WINDOW seconds until stopped,
    every request recorded (oha writes its database only when a run ends, and not when interrupted)."""

    WINDOW = 2

    def __init__(self, port, prefix, rate, db):
        self.windows, self.stopping = [], threading.Event()
        self.args = ["oha", "--no-tui", "-z", f"{self.WINDOW}s", "-q", str(rate), "--latency-correction",
                     "-c", "20", "--rand-regex-url", f"http://127.0.0.1:{port}{prefix}[1-9]?[13579]"]
        self.thread = threading.Thread(target=self.run, args=(db,))
        self.thread.start()

    def run(self, db):
        while not self.stopping.is_set():
            path = f"{db}.{len(self.windows)}"
            base = time.time()
            subprocess.run(self.args + ["--db-url", path], check=True, stdout=subprocess.DEVNULL)
            self.windows.append((base, path))

    def stop(self):
        self.stopping.set()
        self.thread.join()

    def latencies(self, t0, t1):
        """Latencies (ms, corrected for coordinated omission) of requests started between t0 and t1."""
        out = []
        for base, path in self.windows:
            con = sqlite3.connect(path)
            rows = con.execute("SELECT COALESCE(start_latency_correction, start), end, status FROM oha").fetchall()
            con.close()
            out += [(e - s) * 1000 for s, e, status in rows if t0 <= base + s < t1 and status == 200]
        return out


def pct(values, q):
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def purge_burst(port, paths, seconds=1.0, senders=10):
    """PURGE every path within `seconds`, from `senders` keep-alive connections; returns latencies in ms."""
    out, lock = [], threading.Lock()
    per = [paths[i::senders] for i in range(senders)]
    begin = time.time()

    def send(mine):
        conn = http.client.HTTPConnection("127.0.0.1", port)
        for k, path in enumerate(mine):
            due = begin + seconds * k / len(mine)
            time.sleep(max(0.0, due - time.time()))
            t = time.time()
            conn.request("PURGE", path)
            resp = conn.getresponse()
            resp.read()
            if resp.status != 200:
                raise RuntimeError(f"PURGE {path}: {resp.status}")
            with lock:
                out.append((time.time() - t) * 1000)
        conn.close()

    threads = [threading.Thread(target=send, args=(m,)) for m in per]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out, time.time() - begin


def one_round(name, port, ctl, prefix, args, work):
    res = {}
    res["fill_s"] = fill(port, prefix, args.objects)
    ctl.settle()
    time.sleep(2)
    db = f"{work}/{name}-{prefix.strip('/').replace('/', '-')}.db"
    before_s, after_s = 8, 5
    base = time.time()
    load = HotLoad(port, prefix, args.rate, db)
    time.sleep(before_s)
    fetched = origin_total()
    t_ban = time.time()
    ctl.ban_prefix(prefix, even_only=True)
    while not ctl.lurker_done():
        if time.time() - t_ban > args.max_walk:
            break
        time.sleep(0.05)
    t_done = time.time()
    res["walk_s"] = t_done - t_ban
    time.sleep(after_s)
    t_after = time.time()
    res["ban_fetches"] = origin_total() - fetched
    # 1000 purges of cold objects (odd, so not banned) under the same hit load.
    time.sleep(1)
    t_purge = time.time()
    purged = [f"{prefix}{2 * k + 1}" for k in range(500, 500 + args.purges)]
    purge_lat, purge_s = purge_burst(port, purged)
    t_purged = time.time()
    time.sleep(0.5)
    load.stop()
    res["purge_send_s"] = purge_s
    res["purge_p99"] = pct(purge_lat, 0.99)
    before = load.latencies(base + 1, t_ban)
    during = load.latencies(t_ban, t_done)
    after = load.latencies(t_done, t_after)
    purging = load.latencies(t_purge, t_purged)
    for label, values in [("before", before), ("during", during), ("after", after), ("purging", purging)]:
        res[f"{label}_p50"] = pct(values, 0.5)
        res[f"{label}_p99"] = pct(values, 0.99)
    # Every purged object is gone: asking for 20 of them reaches the origin 20 times.
    fetched = origin_total()
    for path in purged[:: max(1, len(purged) // 20)][:20]:
        urllib.request.urlopen(f"http://127.0.0.1:{port}{path}").read()
    res["purged_refetched_of_20"] = origin_total() - fetched
    # Leave the next round an empty cache of this round's objects.
    ctl.ban_prefix(prefix, even_only=False)
    deadline = time.time() + args.max_walk
    while not ctl.lurker_done() and time.time() < deadline:
        time.sleep(0.1)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--objects", type=int, default=100_000)
    ap.add_argument("--rate", type=int, default=2000, help="hit load on the hot set, requests per second")
    ap.add_argument("--purges", type=int, default=1000)
    ap.add_argument("--max-walk", type=int, default=60, help="seconds to wait for a lurker")
    ap.add_argument("--json", help="also write the raw results here")
    args = ap.parse_args()

    work = tempfile.mkdtemp(prefix="lacquer-bench-inv-")
    procs = []
    raw = {t: [] for t in TARGETS}
    try:
        start(work, procs)
        ctls = {"lacquer": Lacquer(work), "varnish": Varnish(work)}
        names = list(TARGETS)
        for r in range(args.rounds):
            for name in names[r % 2:] + names[:r % 2]:
                res = one_round(name, TARGETS[name], ctls[name], f"/small/{r}/", args, work)
                raw[name].append(res)
                print(f"round {r + 1} {name}: " + ", ".join(f"{k} {v:.2f}" for k, v in res.items()), file=sys.stderr)
    finally:
        stop(procs, work)

    med = {t: {k: statistics.median(r[k] for r in runs) for k in runs[0]} for t, runs in raw.items()}
    rows = [
        (f"fill {args.objects} objects (s)", "fill_s", "{:.1f}"),
        (f"hit p50 before the ban, {args.rate} rps (ms)", "before_p50", "{:.2f}"),
        ("hit p99 before the ban (ms)", "before_p99", "{:.2f}"),
        ("hit p50 during the lurker's walk (ms)", "during_p50", "{:.2f}"),
        ("hit p99 during the lurker's walk (ms)", "during_p99", "{:.2f}"),
        ("hit p99 after the walk (ms)", "after_p99", "{:.2f}"),
        ("ban to lurker done (s)", "walk_s", "{:.2f}"),
        ("origin fetches caused by the ban", "ban_fetches", "{:.0f}"),
        (f"{args.purges} PURGEs: time to send (s)", "purge_send_s", "{:.2f}"),
        ("PURGE latency p99 (ms)", "purge_p99", "{:.2f}"),
        ("hit p99 while purging (ms)", "purging_p99", "{:.2f}"),
        ("purged objects refetched (of 20 asked)", "purged_refetched_of_20", "{:.0f}"),
    ]
    print(f"\nmedian of {args.rounds} rounds; ratio = lacquer / varnish (lower is better except where noted)\n")
    ratio_table(rows, med)
    for t in TARGETS:
        print(f"\n{t}: p99 during the walk / p99 before = {med[t]['during_p99'] / med[t]['before_p99']:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(raw, f, indent=1)


if __name__ == "__main__":
    main()
