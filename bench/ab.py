#!/usr/bin/env python3
"""Two lacquerd builds side by side on the hit path, to tell whether a change costs anything: both run at
once in front of one origin, and each round measures A then B (B then A on odd rounds) with `wrk` (max rps on
a cached 2 KiB object), `oha` (p50/p99 at a fixed rate) and a cold burst (`--clients` clients at once for
one uncached 4 MiB object: time to first byte, and how many fetches reached the origin). Prints each round
and the median of the per-round ratios B / A; on these noisy 2-core machines only those ratios mean
anything."""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare import ORIGIN_PORT, ROOT, burst, oha_latency, stop, wait_port, wrk_rps  # noqa: E402

PORTS = {"A": 8984, "B": 8985}
ADMIN = {"A": 8993, "B": 8994}


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("a", help="the lacquerd binary before the change")
    ap.add_argument("b", nargs="?", default=f"{ROOT}/target/release/lacquerd", help="the binary after it")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--seconds", type=int, default=8)
    ap.add_argument("--rate", type=int, default=5000)
    ap.add_argument("--clients", type=int, default=200, help="clients in the cold burst")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="lacquer-ab-")
    procs = [subprocess.Popen([f"{ROOT}/target/release/bench-origin", str(ORIGIN_PORT)])]
    try:
        for name, binary in (("A", args.a), ("B", args.b)):
            procs.append(subprocess.Popen(
                [binary, "--listen", f"127.0.0.1:{PORTS[name]}", "--admin", f"127.0.0.1:{ADMIN[name]}",
                 "--backend", f"127.0.0.1:{ORIGIN_PORT}", "--disk", f"{work}/{name}", "--memory", "256MiB",
                 "--disk-size", "2GiB"],
                env={**os.environ, "RUST_LOG": "warn"}))
        wait_port(ORIGIN_PORT)
        for port in PORTS.values():
            wait_port(port)
        rows = {"rps": [], "p50": [], "p99": [], "burst_p50": [], "burst_p99": []}
        fetches = {"A": [], "B": []}
        for r in range(args.rounds):
            got = {}
            for name in (("A", "B") if r % 2 == 0 else ("B", "A")):
                rps = wrk_rps(PORTS[name], args.seconds)
                p50, p99 = oha_latency(PORTS[name], args.seconds, args.rate)
                b50, b99, fetched, complete = burst(PORTS[name], f"ab-{r}-{name}", args.clients)
                if complete != args.clients:
                    sys.exit(f"round {r + 1}: {name} completed {complete} of {args.clients} burst bodies")
                fetches[name].append(fetched)
                got[name] = {"rps": rps, "p50": p50, "p99": p99, "burst_p50": b50, "burst_p99": b99}
            for key in rows:
                rows[key].append(got["B"][key] / got["A"][key])
            print(f"round {r + 1}: A {got['A']}  B {got['B']}", file=sys.stderr)
        print(f"\nB / A, median of {args.rounds} alternating rounds (range):\n")
        print("| metric | B / A | range |")
        print("|---|---|---|")
        for label, key in (("hit max rps (wrk)", "rps"), (f"hit p50 at {args.rate} rps", "p50"),
                           (f"hit p99 at {args.rate} rps", "p99"),
                           (f"cold 4 MiB burst, {args.clients} clients, TTFB p50", "burst_p50"),
                           (f"cold 4 MiB burst, {args.clients} clients, TTFB p99", "burst_p99")):
            v = rows[key]
            print(f"| {label} | {statistics.median(v):.3f} | {min(v):.2f}–{max(v):.2f} |")
        print(f"\norigin fetches per burst: A {fetches['A']}, B {fetches['B']}")
    finally:
        stop(procs, work)


if __name__ == "__main__":
    main()
