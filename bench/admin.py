#!/usr/bin/env python3
"""The operator's tools side by side: lacquerd's cachectl against Varnish's varnishstat and varnishadm, in the
same run, alternating which goes first each round.

Per round and target:
- how long the statistics command takes, start to exit (`cachectl stats --json` / `varnishstat -1 -j`);
- how long adding a ban takes, start to exit (`cachectl ban` / `varnishadm ban`);
- what watching costs the data path: hit p50/p99 at a steady rate with nobody watching, then with a
  dashboard attached (lacquerd: a `/v1/stats/stream` reader plus a `/metrics` scrape every second;
  Varnish: `varnishstat -1 -j` every second, what its exporters run);
- what the live screen costs: CPU used by `cachetop` / `varnishstat` (curses) on a 100x30 pseudo-terminal
  while the target serves the same steady load, as a share of one core.
Reports medians of the rounds and lacquer/varnish ratios."""

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare import ROOT, TARGETS, oha_latency, ratio_table, start, stop  # noqa: E402

CACHECTL = f"{ROOT}/target/release/cachectl"
CACHETOP = f"{ROOT}/target/release/cachetop"
ADMIN = "127.0.0.1:8991"


def timed(cmd, runs):
    """Median wall time of `cmd` in milliseconds over `runs` runs."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def screen_cpu(cmd, port, seconds, rate):
    """Percent of one core `cmd` uses on a 100x30 pseudo-terminal (util-linux `script`) over `seconds`, while
    `port` serves `rate` hits per second."""
    load = subprocess.Popen(["oha", "--no-tui", "-z", f"{seconds + 4}s", "-q", str(rate), "-c", "20",
                             f"http://127.0.0.1:{port}/obj/2k"], stdout=subprocess.DEVNULL)
    script = subprocess.Popen(["script", "-q", "-c", f"stty rows 30 cols 100; exec {shlex.join(cmd)}", "/dev/null"],
                              stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                              env={**os.environ, "TERM": "xterm-256color"})
    time.sleep(2)
    pid = int(open(f"/proc/{script.pid}/task/{script.pid}/children").read().split()[0])
    before = cpu_seconds(pid)
    time.sleep(seconds)
    used = cpu_seconds(pid) - before
    script.stdin.write(b"q")
    script.stdin.flush()
    script.wait(timeout=10)
    load.wait()
    return used / seconds * 100


class Watcher:
    """Runs `tick` every second in a thread until stopped."""

    def __init__(self, tick):
        self.tick, self.done = tick, threading.Event()
        self.thread = threading.Thread(target=self.run)

    def run(self):
        while not self.done.wait(1.0):
            self.tick()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()


def lacquer_tools(work):
    secret = f"{work}/lacquer/secret"
    ctl = [CACHECTL, "--admin", ADMIN, "--secret", secret]
    token = open(secret).read().strip()

    def scrape():
        req = urllib.request.Request(f"http://{ADMIN}/metrics", headers={"authorization": f"Bearer {token}"})
        urllib.request.urlopen(req).read()

    def watching():
        stream = subprocess.Popen(["curl", "-sN", "-H", f"authorization: Bearer {token}",
                                   f"http://{ADMIN}/v1/stats/stream"], stdout=subprocess.DEVNULL)
        watcher = Watcher(scrape)

        class Both:
            def __enter__(self):
                watcher.__enter__()

            def __exit__(self, *exc):
                watcher.__exit__()
                stream.terminate()
                stream.wait()
        return Both()

    return {
        "stats": ctl + ["stats", "--json"],
        "ban": lambda i: ctl + ["ban", f"req.url ~ ^/nothing/{i}/"],
        "watching": watching,
        "screen": [CACHETOP, "--admin", ADMIN, "--secret", secret],
    }


def varnish_tools(work):
    n = ["-n", f"{work}/varnish"]
    stat = ["varnishstat"] + n + ["-1", "-j"]
    return {
        "stats": stat,
        "ban": lambda i: ["varnishadm"] + n + ["ban", "req.url", "~", f"^/nothing/{i}/"],
        "watching": lambda: Watcher(lambda: subprocess.run(stat, stdout=subprocess.DEVNULL, check=True)),
        "screen": ["varnishstat"] + n,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=20, help="command runs per round and target")
    ap.add_argument("--seconds", type=int, default=10, help="length of each latency window")
    ap.add_argument("--rate", type=int, default=2000)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="lacquer-admin-bench-")
    procs = []
    start(work, procs)
    try:
        tools = {"lacquer": lacquer_tools(work), "varnish": varnish_tools(work)}
        results = {name: {} for name in tools}
        ban_id = 0
        for r in range(args.rounds):
            order = list(tools) if r % 2 == 0 else list(reversed(tools))
            for name in order:
                t, port = tools[name], TARGETS[name]
                row = results[name]
                row.setdefault("stats_ms", []).append(timed(t["stats"], args.runs))
                times = []
                for _ in range(args.runs):
                    ban_id += 1
                    times.append(timed(t["ban"](ban_id), 1))
                row.setdefault("ban_ms", []).append(statistics.median(times))
                p50, p99 = oha_latency(port, args.seconds, args.rate)
                row.setdefault("idle_p50", []).append(p50)
                row.setdefault("idle_p99", []).append(p99)
                with t["watching"]():
                    p50, p99 = oha_latency(port, args.seconds, args.rate)
                row.setdefault("watched_p50", []).append(p50)
                row.setdefault("watched_p99", []).append(p99)
                row.setdefault("screen_cpu", []).append(screen_cpu(t["screen"], port, args.seconds, args.rate))
                print(f"round {r + 1} {name}: " + ", ".join(f"{k} {v[-1]:.2f}" for k, v in row.items()),
                      flush=True)
        med = {n: {k: statistics.median(v) for k, v in row.items()} for n, row in results.items()}
        rows = [
            ("statistics command (ms)", "stats_ms"),
            ("add a ban (ms)", "ban_ms"),
            (f"hit p50, nobody watching, {args.rate} rps (ms)", "idle_p50"),
            (f"hit p99, nobody watching, {args.rate} rps (ms)", "idle_p99"),
            ("hit p50 while watched every second (ms)", "watched_p50"),
            ("hit p99 while watched every second (ms)", "watched_p99"),
            ("live screen CPU, % of one core (cachetop / varnishstat)", "screen_cpu"),
        ]
        print(f"\n{args.rounds} rounds, medians\n")
        ratio_table([(label, key, "{:.2f}") for label, key in rows], med)
        for name in med:
            cost = med[name]["watched_p99"] / med[name]["idle_p99"]
            print(f"\n{name}: watching changes hit p99 by {cost:.2f}x")
    finally:
        stop(procs, work)


if __name__ == "__main__":
    main()
