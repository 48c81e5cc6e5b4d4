#!/usr/bin/env python3
"""Flame graphs from `perf record -g` data with nothing but perf and Python: bench/cpu.py's --perf uses it when
neither inferno (`inferno-collapse-perf`, `inferno-flamegraph`) nor Brendan Gregg's FlameGraph scripts
(`stackcollapse-perf.pl`, `flamegraph.pl`) are installed, and writes the same folded stacks they read.

    python3 bench/flame.py perf.data out.svg ["title"]     # writes out.svg and out.folded

collapse() folds `perf script` output the way inferno-collapse-perf does (the thread's name as the root frame,
then caller to callee; symbol offsets and Rust's `::h<hash>` suffixes dropped; an unresolved frame named by its
object, `[libc.so.6]`); render() draws a static SVG: one box per frame, its width its share of the samples,
callers below callees, the name and numbers in a tooltip (no JavaScript zoom or search: re-render the folded
file with inferno-flamegraph for those)."""

import hashlib
import html
import os
import re
import subprocess
import sys

HEADER = re.compile(r"^(\S.*?)\s+\d+(?:/\d+)?\s+(?:\[\d+\]\s+)?[\d.]+:")
FRAME = re.compile(r"^\s+[0-9a-f]+\s+(.*?)\s+\((.*)\)$")
OFFSET = re.compile(r"\+0x[0-9a-f]+$")
RUST_HASH = re.compile(r"::h[0-9a-f]{16}$")


def collapse(lines):
    """{folded stack: samples} from the lines of `perf script` (one block per sample, innermost frame first)."""
    stacks, comm, frames = {}, None, []

    def flush():
        if comm is not None:
            key = ";".join([comm] + frames[::-1])
            stacks[key] = stacks.get(key, 0) + 1

    for line in lines:
        line = line.rstrip("\n")
        if not line.strip():
            flush()
            comm, frames = None, []
            continue
        if not line[0].isspace():
            flush()
            m = HEADER.match(line)
            comm, frames = (m.group(1).strip() if m else line.split()[0]).replace(";", ":").replace(" ", "_"), []
            continue
        m = FRAME.match(line)
        if not m or comm is None:
            continue
        sym, dso = m.group(1), m.group(2)
        if sym == "[unknown]" or not sym:
            dso = os.path.basename(dso)
            sym = dso if dso.startswith("[") else f"[{dso}]"
        else:
            sym = RUST_HASH.sub("", OFFSET.sub("", sym))
        frames.append(sym.replace(";", ":"))
    flush()
    return stacks


def write_folded(stacks, path):
    with open(path, "w") as f:
        for key in sorted(stacks):
            f.write(f"{key} {stacks[key]}\n")


def read_folded(path):
    stacks = {}
    for line in open(path):
        key, _, count = line.rstrip("\n").rpartition(" ")
        if key:
            stacks[key] = stacks.get(key, 0) + int(count)
    return stacks


def color(name):
    """A warm colour of its own for every name (the classic flame graph's palette)."""
    h = hashlib.md5(name.encode()).digest()
    return f"rgb({205 + h[0] % 50},{h[1] % 230},{h[2] % 55})"


def render(stacks, title, width=1200, frame_h=16, min_px=0.1):
    """The SVG text of a flame graph of `stacks` ({folded stack: samples})."""
    root = {"n": 0, "c": {}}
    for key, count in stacks.items():
        node = root
        node["n"] += count
        for name in key.split(";"):
            node = node["c"].setdefault(name, {"n": 0, "c": {}})
            node["n"] += count
    total = max(root["n"], 1)
    scale = (width - 20) / total
    boxes, depth_max = [], 0

    def walk(node, x, depth):
        nonlocal depth_max
        for name in sorted(node["c"]):
            child = node["c"][name]
            w = child["n"] * scale
            if w >= min_px:
                boxes.append((name, x, depth, w, child["n"]))
                depth_max = max(depth_max, depth)
                walk(child, x, depth + 1)
            x += w

    walk(root, 10.0, 0)
    height = (depth_max + 1) * frame_h + 60
    out = [f'<?xml version="1.0" standalone="no"?>\n<svg version="1.1" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg">',
           '<style>text { font-family: Verdana, sans-serif; font-size: 12px; fill: #000; } '
           'rect:hover { stroke: #000; stroke-width: 0.5; }</style>',
           f'<rect x="0" y="0" width="{width}" height="{height}" fill="#eeeeee"/>',
           f'<text x="{width / 2}" y="24" text-anchor="middle" style="font-size:17px">{html.escape(title)}</text>',
           f'<text x="10" y="{height - 8}">{total} samples; hover a frame for its name and share '
           '(bench/flame.py)</text>']
    for name, x, depth, w, n in boxes:
        y = height - 30 - (depth + 1) * frame_h
        tip = html.escape(f"{name} ({n} samples, {100 * n / total:.2f}%)")
        out.append(f'<g><title>{tip}</title><rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{frame_h - 1}" '
                   f'rx="2" fill="{color(name)}"/>')
        chars = int((w - 6) / 7)
        if chars >= 3:
            label = name if len(name) <= chars else name[:chars - 2] + ".."
            out.append(f'<text x="{x + 3:.2f}" y="{y + frame_h - 4}">{html.escape(label)}</text>')
        out.append("</g>")
    out.append("</svg>\n")
    return "\n".join(out)


def perf_script(data, inline=False):
    """The lines of `perf script` for `data` (inlined frames left out unless `inline`: resolving them costs
    addr2line tens of seconds per thousand samples of a debug-info binary)."""
    proc = subprocess.run(["perf", "script", "-i", data] + ([] if inline else ["--no-inline"]),
                          capture_output=True, text=True, errors="replace", check=True)
    return proc.stdout.splitlines()


def main():
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    data, svg = sys.argv[1], sys.argv[2]
    title = sys.argv[3] if len(sys.argv) > 3 else os.path.basename(data)
    stacks = collapse(perf_script(data))
    write_folded(stacks, os.path.splitext(svg)[0] + ".folded")
    with open(svg, "w") as f:
        f.write(render(stacks, title))


if __name__ == "__main__":
    main()
