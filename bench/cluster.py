#!/usr/bin/env python3
"""Issue 16's cluster benchmark, on this one machine, ports 8880-8899 (compare.py has 8979-8992, large.py
8780-8792).

`hash` (the data plane): three nodes, each with a small memory, behind HAProxy running the packaged
packaging/haproxy.cfg (addresses put in, as tests/tests/cluster_haproxy.rs does), one origin
(bench/origin's /sized/ route). Targets, each on fresh nodes every round, order rotating between rounds:

  lacquer-chash    3 lacquerd (single-node mode, no [cluster]) behind HAProxy's consistent URL hashing
  lacquer-rr       the same 3 behind HAProxy round robin (the packaged file with `balance roundrobin`)
  varnish-chash    3 varnishd (-s malloc) behind the same consistent hashing

Per round and target a catalogue of N objects is read twice with wrk (a Lua script gives each thread its
share of the URL list, every URL exactly once per pass): first in sequence, then in a random order. Reported:
origin fetches per pass, the second pass's share served without the origin, and wrk's latency p50/p99
(closed loop, -t2 -c16) per pass.

`bans` (the control plane; needs the [cluster] section of docs/cluster.md): one etcd and three lacquerd with
[cluster] (self_routing = false). 100 bans posted to node 1's admin API, one at a time: the time from the
POST to its acknowledgement, and to every node's GET /v1/cluster showing an applied_revision at least the
ban's (the invalidation log's revision in etcd once the ban is acknowledged), p50/p99. Then invalidation throughput: N
senders (keep-alive connections spread over the nodes) alternating bans and URL purges for a few seconds:
acknowledged per second, and how long until every node had applied them all; the same senders against one
lacquerd without [cluster] for reference. For both, the cores kept busy (the target's processes and the senders)
and the target's CPU per acknowledged invalidation: on one small machine the cluster's four processes share
the CPU the single node has to itself."""

import argparse
import base64
import http.client
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ORIGIN_PORT = 8880
CONTROL_PORT = 8881
NODE_PORTS = [8882, 8883, 8884]
# lacquerd's admin listeners (health checks, stats, bans); Varnish's plain health listeners.
HEALTH_PORTS = [8885, 8886, 8887]
VARNISH_ADMIN_PORTS = [8888, 8889, 8890]
FRONT_PORT = 8891
ETCD_CLIENT_PORT = 8892
ETCD_PEER_PORT = 8893
PREFIX = "/lacquer-bench"
TARGETS = ["lacquer-chash", "lacquer-rr", "varnish-chash"]
WARM = "/obj/2k"

WRK_SCRIPT = """
-- Each thread reads its own list of paths and sends each once; once a thread has all its answers it
-- marks itself done (the runner then stops wrk) and stops. Requests sent after a thread's list ran out
-- (at most one per connection) go to a URL every node already holds.
local threads = {}
function setup(thread)
  thread:set("id", #threads)
  table.insert(threads, thread)
end
function init(args)
  dir = args[1]
  paths = {}
  for line in io.lines(dir .. "/paths." .. id) do paths[#paths + 1] = line end
  sent, received = 0, 0
  -- wrk calls thread 0's request() once before the run to inspect the request: that call gets no path.
  if id == 0 then sent = -1 end
end
function request()
  sent = sent + 1
  if sent < 1 or sent > #paths then return wrk.format("GET", "WARM_PATH") end
  return wrk.format("GET", paths[sent])
end
function response(status, headers, body)
  received = received + 1
  if received == #paths then
    io.open(dir .. "/done." .. id, "w"):close()
    wrk.thread:stop()
  end
end
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("RESULT %d %d %d %d %d\\n", summary.requests,
    e.connect + e.read + e.write + e.timeout + e.status,
    latency:percentile(50), latency:percentile(99), latency.max))
end
""".replace("WARM_PATH", WARM)


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout


def get(url, headers=None, timeout=5):
    req = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.read()


def wait_for(what, check, timeout=30):
    deadline = time.time() + timeout
    while True:
        try:
            if check():
                return
        except Exception:
            pass
        if time.time() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.1)


def origin_fetches():
    """Requests the origin received for the catalogue: all of them but the warm URL's (a node that evicted
    it fetches it again when a wrk thread's list has run out)."""
    total = int(get(f"http://127.0.0.1:{ORIGIN_PORT}/__total")[1])
    return total - int(get(f"http://127.0.0.1:{ORIGIN_PORT}/__count{WARM}")[1])


class Stack:
    """Processes started for one measurement, stopped together (SIGTERM, then SIGKILL after 30 s)."""

    def __init__(self):
        self.procs = []

    def spawn(self, cmd, **kw):
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, **kw)
        self.procs.append(p)
        return p

    def stop(self):
        """Last started, first stopped, each before the next: cluster nodes leave while etcd is still up."""
        for p in reversed(self.procs):
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = []


def haproxy_config(work, balance):
    """packaging/haproxy.cfg with this machine's addresses: the frontend on FRONT_PORT, server i on
    NODE_PORTS[i] checked on HEALTH_PORTS[i]; no chroot, user, daemon mode or syslog; the stats socket in
    `work`; `balance` "chash" (as packaged) or "rr" (round robin, hash-type dropped)."""
    with open(f"{ROOT}/packaging/haproxy.cfg") as f:
        text = f.read()
    out, servers = [], 0
    for line in text.splitlines():
        words = line.split()
        if words[:1] in (["chroot"], ["user"], ["group"], ["daemon"]) or words[:2] == ["log", "/dev/log"]:
            continue
        if words[:2] == ["stats", "socket"]:
            line = f"    stats socket {work}/haproxy.sock mode 600 level admin"
        elif words[:1] == ["maxconn"]:
            line = "    maxconn 4000"
        elif words == ["bind", ":80"]:
            line = f"    bind 127.0.0.1:{FRONT_PORT}"
        elif words[:1] == ["server"] and words[3:4] == ["id"]:
            i = int(words[4]) - 1
            line = (f"    server {words[1]} 127.0.0.1:{NODE_PORTS[i]} id {i + 1} "
                    f"check addr 127.0.0.1 port {HEALTH_PORTS[i]}")
            servers += 1
        elif balance == "rr" and words[:1] == ["balance"]:
            line = "    balance roundrobin"
        elif balance == "rr" and words[:1] == ["hash-type"]:
            continue
        out.append(line)
    if servers != 3:
        raise SystemExit("packaging/haproxy.cfg: expected three server lines")
    conf = f"{work}/haproxy.cfg"
    with open(conf, "w") as f:
        f.write("\n".join(out) + "\n")
    return conf


def haproxy_servers_up(work):
    s = socket.socket(socket.AF_UNIX)
    s.connect(f"{work}/haproxy.sock")
    s.sendall(b"show stat\n")
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    s.close()
    lines = data.decode().splitlines()
    names = lines[0].lstrip("# ").split(",")
    rows = [dict(zip(names, l.split(","))) for l in lines[1:] if l]
    states = [r["status"] for r in rows if r["pxname"] == "lacquer" and r["svname"] not in ("BACKEND", "FRONTEND")]
    return len(states) == 3 and all(s == "UP" for s in states)


def start_haproxy(stack, work, balance):
    conf = haproxy_config(work, balance)
    sh(["/usr/sbin/haproxy", "-c", "-q", "-f", conf])
    stack.spawn(["/usr/sbin/haproxy", "-db", "-f", conf], stderr=open(f"{work}/haproxy.log", "w"))
    wait_for("HAProxy's three servers UP", lambda: haproxy_servers_up(work))


def lacquer_node(stack, work, i, args, extra_toml=""):
    """lacquerd node i: PROXY protocol on its client listener (the packaged server lines send it), its
    admin API on HEALTH_PORTS[i]. Returns its store directory (the secret is in it)."""
    store = f"{work}/n{i + 1}"
    conf = f"{work}/n{i + 1}.toml"
    with open(conf, "w") as f:
        f.write(f'[[listen]]\naddress = "127.0.0.1:{NODE_PORTS[i]}"\nproxy_protocol = true\n{extra_toml}')
    stack.spawn([args.lacquerd, "--config", conf, "--admin", f"127.0.0.1:{HEALTH_PORTS[i]}",
                 "--backend", f"127.0.0.1:{ORIGIN_PORT}", "--disk", store, "--memory", args.memory,
                 "--disk-size", args.disk_size], env={**os.environ, "RUST_LOG": "warn"})
    return store


def start_lacquer(stack, work, args):
    for i in range(3):
        lacquer_node(stack, work, i, args)
    for port in HEALTH_PORTS:
        wait_for(f"lacquerd admin on {port}", lambda: get(f"http://127.0.0.1:{port}/v1/health")[0] == 200)


def start_varnish(stack, work, args):
    """Three varnishd with the default VCL but for a /v1/health answered by Varnish itself on a plain
    listener (the health checks), the client listener taking the PROXY protocol as lacquerd's does."""
    vcl = f"{work}/bench.vcl"
    with open(vcl, "w") as f:
        f.write(f'''vcl 4.1;
backend origin {{ .host = "127.0.0.1"; .port = "{ORIGIN_PORT}"; }}
sub vcl_recv {{
    if (req.url == "/v1/health") {{ return (synth(200, "OK")); }}
}}
''')
    for i in range(3):
        stack.spawn(["/usr/sbin/varnishd", "-F", "-j", "none", "-n", f"{work}/v{i + 1}",
                     "-a", f"proxy=127.0.0.1:{NODE_PORTS[i]},PROXY", "-a", f"health=127.0.0.1:{HEALTH_PORTS[i]}",
                     "-T", f"127.0.0.1:{VARNISH_ADMIN_PORTS[i]}", "-f", vcl, "-s", f"malloc,{args.varnish_malloc}"],
                    stderr=open(f"{work}/varnish{i + 1}.log", "w"))
    for port in HEALTH_PORTS:
        wait_for(f"varnishd on {port}", lambda: get(f"http://127.0.0.1:{port}/v1/health")[0] == 200)


def wrk_pass(work, paths, threads, connections):
    """Every path once through HAProxy, split over wrk's threads; wrk's counts and latencies (ms)."""
    for f in os.listdir(work):
        if f.startswith(("paths.", "done.")):
            os.remove(f"{work}/{f}")
    for t in range(threads):
        with open(f"{work}/paths.{t}", "w") as f:
            f.write("\n".join(paths[t::threads]) + "\n")
    script = f"{work}/pass.lua"
    with open(script, "w") as f:
        f.write(WRK_SCRIPT)
    start = time.time()
    wrk = subprocess.Popen(["wrk", f"-t{threads}", f"-c{connections}", "-d600s", "--timeout", "10s", "-s", script,
                            f"http://127.0.0.1:{FRONT_PORT}/", "--", work], stdout=subprocess.PIPE, text=True)
    while not all(os.path.exists(f"{work}/done.{t}") for t in range(threads)):
        if wrk.poll() is not None:
            raise SystemExit("wrk stopped before the pass was done")
        time.sleep(0.05)
    seconds = time.time() - start
    wrk.send_signal(signal.SIGINT)
    out, _ = wrk.communicate(timeout=30)
    line = next(l for l in out.splitlines() if l.startswith("RESULT"))
    requests, errors, p50, p99, worst = (int(x) for x in line.split()[1:])
    return {"requests": requests, "errors": errors, "p50": p50 / 1000, "p99": p99 / 1000, "max": worst / 1000,
            "seconds": seconds}


def hash_round(target, work, args, rnd):
    stack = Stack()
    try:
        if target.startswith("lacquer"):
            start_lacquer(stack, work, args)
        else:
            start_varnish(stack, work, args)
        start_haproxy(stack, work, "rr" if target.endswith("-rr") else "chash")
        # The URL sent after a wrk thread's list runs out, on every node (round robin: 2 requests each).
        for _ in range(6):
            get(f"http://127.0.0.1:{FRONT_PORT}{WARM}")
        size = args.object_kib * 1024
        paths = [f"/sized/{size}/{i:06d}" for i in range(args.objects)]
        before = origin_fetches()
        first = wrk_pass(work, paths, args.threads, args.connections)
        middle = origin_fetches()
        shuffled = paths[:]
        random.Random(rnd).shuffle(shuffled)
        second = wrk_pass(work, shuffled, args.threads, args.connections)
        after = origin_fetches()
        return {
            "fetches_1": middle - before, "fetches_2": after - middle, "fetches": after - before,
            "served_2": 100 * (1 - (after - middle) / args.objects),
            "p50_1": first["p50"], "p99_1": first["p99"], "p50_2": second["p50"], "p99_2": second["p99"],
            "rps_1": args.objects / first["seconds"], "rps_2": args.objects / second["seconds"],
            "errors": first["errors"] + second["errors"],
        }
    finally:
        stack.stop()
        for entry in os.listdir(work):
            path = f"{work}/{entry}"
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)


def run_hash(args, work):
    load = os.getloadavg()[0]
    origin = subprocess.Popen([f"{ROOT}/target/release/bench-origin", str(ORIGIN_PORT), str(CONTROL_PORT)])
    try:
        wait_for("the origin", lambda: get(f"http://127.0.0.1:{ORIGIN_PORT}{WARM}")[0] == 200)
        results = {t: [] for t in TARGETS}
        for rnd in range(args.rounds):
            order = TARGETS[rnd % len(TARGETS):] + TARGETS[:rnd % len(TARGETS)]
            for target in order:
                r = hash_round(target, work, args, rnd)
                results[target].append(r)
                print(f"round {rnd + 1} {target}: {json.dumps(r)}", flush=True)
    finally:
        origin.terminate()
        origin.wait()
    med = {t: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for t, rs in results.items()}
    print(f"\n{args.objects} objects of {args.object_kib} KiB read twice through HAProxy (first in sequence, "
          f"then in a random order), wrk -t{args.threads} -c{args.connections}; lacquerd --memory {args.memory} "
          f"--disk-size {args.disk_size}, varnishd -s malloc,{args.varnish_malloc}; median of {args.rounds} rounds; "
          f"load average (1 min) before: {load:.2f}, after: {os.getloadavg()[0]:.2f}\n")
    rows = [("origin fetches, both passes", "fetches", "{:.0f}"), ("origin fetches, first pass", "fetches_1", "{:.0f}"),
            ("origin fetches, second pass", "fetches_2", "{:.0f}"),
            ("second pass served without the origin (%)", "served_2", "{:.1f}"),
            ("p50, first pass (ms)", "p50_1", "{:.2f}"), ("p99, first pass (ms)", "p99_1", "{:.2f}"),
            ("p50, second pass (ms)", "p50_2", "{:.2f}"), ("p99, second pass (ms)", "p99_2", "{:.2f}"),
            ("requests/s, first pass", "rps_1", "{:.0f}"), ("requests/s, second pass", "rps_2", "{:.0f}"),
            ("errors (wrk)", "errors", "{:.0f}")]
    print("| metric | " + " | ".join(TARGETS) + " | lacquer-chash / lacquer-rr | lacquer-chash / varnish-chash |")
    print("|---" * (len(TARGETS) + 3) + "|")
    for label, key, fmt in rows:
        cells = [fmt.format(med[t][key]) for t in TARGETS]
        lc, rr, vc = (med[t][key] for t in TARGETS)
        ratio = lambda a, b: f"{a / b:.2f}" if b else "-"
        print(f"| {label} | " + " | ".join(cells) + f" | {ratio(lc, rr)} | {ratio(lc, vc)} |")


class Admin:
    """Keep-alive connection to one lacquerd admin API."""

    def __init__(self, port, secret):
        self.port, self.secret = port, secret
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)

    def call(self, method, path, body=None):
        headers = {"authorization": f"Bearer {self.secret}"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["content-type"] = "application/json"
        try:
            self.conn.request(method, path, body=data, headers=headers)
            r = self.conn.getresponse()
        except (http.client.HTTPException, OSError):
            self.conn.close()
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
            self.conn.request(method, path, body=data, headers=headers)
            r = self.conn.getresponse()
        payload = r.read()
        return r.status, (json.loads(payload) if payload else None)

    def cluster(self):
        status, view = self.call("GET", "/v1/cluster")
        if status != 200:
            raise SystemExit(f"GET /v1/cluster on {self.port}: {status} {view}")
        return view


def start_etcd(stack, work):
    data = f"{work}/etcd"
    client = f"http://127.0.0.1:{ETCD_CLIENT_PORT}"
    peer = f"http://127.0.0.1:{ETCD_PEER_PORT}"
    stack.spawn(["etcd", "--name", "bench", "--data-dir", data, "--listen-client-urls", client,
                 "--advertise-client-urls", client, "--listen-peer-urls", peer,
                 "--initial-advertise-peer-urls", peer, "--initial-cluster", f"bench={peer}",
                 "--log-level", "warn"], stderr=open(f"{work}/etcd.log", "w"))
    wait_for("etcd", lambda: subprocess.run(["etcdctl", f"--endpoints={client}", "endpoint", "health"],
                                            capture_output=True, env={**os.environ, "ETCDCTL_API": "3"}).returncode == 0)
    return client


def log_revision(prefix):
    """The etcd revision of the newest entry of the invalidation log, from etcd's JSON gateway."""
    key = base64.b64encode(f"{prefix}/invalidations".encode()).decode()
    req = urllib.request.Request(f"http://127.0.0.1:{ETCD_CLIENT_PORT}/v3/kv/range",
                                 data=json.dumps({"key": key}).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=5) as r:
        kvs = json.loads(r.read()).get("kvs", [])
    return int(kvs[0]["mod_revision"]) if kvs else 0


def senders(admins, count, seconds, tag):
    """`count` threads, sender k on admins[k % len]: alternately a ban matching nothing and a URL purge,
    for `seconds`. Returns (acknowledged, failed, ack latencies in ms)."""
    acks, fails, lat = [0], [0], []
    lock = threading.Lock()
    stop_at = time.time() + seconds

    def run(k):
        admin = Admin(admins[k % len(admins)].port, admins[k % len(admins)].secret)
        j = 0
        while time.time() < stop_at:
            j += 1
            t0 = time.perf_counter()
            if j % 2:
                status, _ = admin.call("POST", "/v1/bans", {"expression": f"req.url ~ ^/tp/{tag}/{k}/{j}$"})
            else:
                status, _ = admin.call("POST", "/v1/purge", {"url": f"/tp/{tag}/{k}/{j}", "host": "bench"})
            ms = (time.perf_counter() - t0) * 1000
            with lock:
                if 200 <= status < 300:
                    acks[0] += 1
                    lat.append(ms)
                else:
                    fails[0] += 1

    threads = [threading.Thread(target=run, args=(k,)) for k in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return acks[0], fails[0], lat


def cpu_seconds(pids):
    """User and system CPU time so far: of the processes `pids` (the target), and of this one (the
    senders' threads)."""
    tick = os.sysconf("SC_CLK_TCK")
    target = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        target += (int(fields[11]) + int(fields[12])) / tick
    return target, sum(os.times()[:2])


def cpu_since(pids, before):
    """What cpu_seconds counted since `before`."""
    return tuple(now - then for now, then in zip(cpu_seconds(pids), before))


def pct(values, p):
    """Nearest-rank percentile: the 99th of 100 values is the second largest, not the largest."""
    values = sorted(values)
    return values[max(0, -(-len(values) * p // 100) - 1)]


def run_bans(args, work):
    load = os.getloadavg()[0]
    stack = Stack()
    origin = subprocess.Popen([f"{ROOT}/target/release/bench-origin", str(ORIGIN_PORT), str(CONTROL_PORT)])
    # The cluster secret every node must share since the entries are signed (docs/cluster.md, "Trust").
    secret = f"{work}/cluster-secret"
    with open(os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write("the cluster secret of the benchmark\n")
    try:
        etcd = start_etcd(stack, work)
        admins = []
        for i in range(3):
            toml = (f'[cluster]\nnode = "n{i + 1}"\netcd = ["{etcd}"]\nprefix = "{PREFIX}"\n'
                    f'advertise = "127.0.0.1:{NODE_PORTS[i]}"\nadvertise_admin = "127.0.0.1:{HEALTH_PORTS[i]}"\n'
                    f'self_routing = false\nsecret_file = "{secret}"\n')
            store = lacquer_node(stack, work, i, args, toml)
            wait_for(f"node {i + 1}", lambda: get(f"http://127.0.0.1:{HEALTH_PORTS[i]}/v1/health")[0] == 200)
            admins.append(Admin(HEALTH_PORTS[i], open(f"{store}/secret").read().strip()))
        wait_for("three members serving", lambda: all(
            a.cluster()["state"] == "serving" and len(a.cluster()["members"]) == 3 for a in admins))

        acked, applied = [], []
        for i in range(args.bans):
            t0 = time.perf_counter()
            status, body = admins[0].call("POST", "/v1/bans", {"expression": f"req.url ~ ^/bench-ban/{i}$"})
            if not 200 <= status < 300:
                raise SystemExit(f"ban {i}: {status} {body}")
            acked.append((time.perf_counter() - t0) * 1000)
            revision = log_revision(PREFIX)
            pending = list(admins)
            while pending:
                pending = [a for a in pending if a.cluster()["applied_revision"] < revision]
                if time.perf_counter() - t0 > 30:
                    raise SystemExit(f"ban {i} not applied everywhere after 30 s")
            applied.append((time.perf_counter() - t0) * 1000)

        pids = [p.pid for p in stack.procs]
        cpu0 = cpu_seconds(pids)
        acks, fails, lat = senders(admins, args.senders, args.throughput_seconds, "cluster")
        cpu = cpu_since(pids, cpu0)
        t0 = time.perf_counter()
        newest = log_revision(PREFIX)
        wait_for("every node caught up", lambda: all(a.cluster()["applied_revision"] >= newest for a in admins), 120)
        drain = time.perf_counter() - t0
    except BaseException:
        origin.terminate()
        raise
    finally:
        stack.stop()
    # The reference: the same senders against one node without [cluster].
    stack = Stack()
    try:
        for entry in os.listdir(work):
            path = f"{work}/{entry}"
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
        store = lacquer_node(stack, work, 0, args)
        wait_for("single node", lambda: get(f"http://127.0.0.1:{HEALTH_PORTS[0]}/v1/health")[0] == 200)
        single = [Admin(HEALTH_PORTS[0], open(f"{store}/secret").read().strip())]
        s_pids = [p.pid for p in stack.procs]
        s_cpu0 = cpu_seconds(s_pids)
        s_acks, s_fails, s_lat = senders(single, args.senders, args.throughput_seconds, "single")
        s_cpu = cpu_since(s_pids, s_cpu0)
    finally:
        stack.stop()
        origin.terminate()
        origin.wait()

    print(f"\ncontrol plane: 1 etcd ({sh(['etcd', '--version']).splitlines()[0]}), 3 lacquerd with [cluster], "
          f"loopback; load average (1 min) before: {load:.2f}, after: {os.getloadavg()[0]:.2f}\n")
    print("| metric | p50 | p99 | max |")
    print("|---|---|---|---|")
    print(f"| {args.bans} bans, POST to acknowledged on node 1 (ms) | {statistics.median(acked):.1f} | "
          f"{pct(acked, 99):.1f} | {max(acked):.1f} |")
    print(f"| {args.bans} bans, POST to applied on all 3 nodes (ms) | {statistics.median(applied):.1f} | "
          f"{pct(applied, 99):.1f} | {max(applied):.1f} |")
    print(f"\n| invalidations (bans and purges alternating), {args.senders} senders, {args.throughput_seconds} s "
          f"| acknowledged/s | failed | ack p50 (ms) | ack p99 (ms) | cores busy (target + senders) "
          f"| target CPU per ack (ms) |")
    print("|---|---|---|---|---|---|---|")
    # CPU: every process of the target and the senders, over the senders' run; on 2 cores, near 2 busy
    # cores means the machine, not the target, sets the rate.
    print(f"| 3 nodes + etcd | {acks / args.throughput_seconds:.0f} | {fails} | {statistics.median(lat):.1f} | "
          f"{pct(lat, 99):.1f} | {sum(cpu) / args.throughput_seconds:.2f} | "
          f"{1000 * cpu[0] / max(acks, 1):.2f} |")
    print(f"| 1 node, no [cluster] | {s_acks / args.throughput_seconds:.0f} | {s_fails} | "
          f"{statistics.median(s_lat):.1f} | {pct(s_lat, 99):.1f} | {sum(s_cpu) / args.throughput_seconds:.2f} | "
          f"{1000 * s_cpu[0] / max(s_acks, 1):.2f} |")
    print(f"\nevery node had applied every acknowledged invalidation {drain:.2f} s after the senders stopped")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="hash", help="hash, bans, or hash,bans (default hash)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--objects", type=int, default=30000)
    ap.add_argument("--object-kib", type=int, default=4)
    ap.add_argument("--memory", default="64MiB", help="lacquerd's memory tier per node")
    ap.add_argument("--disk-size", default="1GiB", help="lacquerd's disk tier per node")
    ap.add_argument("--varnish-malloc", default="64m", help="varnishd -s malloc size per node")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--bans", type=int, default=100)
    ap.add_argument("--senders", type=int, default=8)
    ap.add_argument("--throughput-seconds", type=int, default=10)
    ap.add_argument("--lacquerd", default=f"{ROOT}/target/release/lacquerd")
    args = ap.parse_args()
    print(f"{time.strftime('%Y-%m-%d %H:%M')}; {sh(['uptime']).strip()}", flush=True)
    work = tempfile.mkdtemp(prefix="lacquer-cluster-")
    try:
        for part in args.only.split(","):
            {"hash": run_hash, "bans": run_bans}[part](args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
