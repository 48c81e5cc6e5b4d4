#!/usr/bin/env bash
# Multi-core scaling on a many-core machine (any box with >= 16 cores); bench/scale/README.md says how to run it.
# Every target is pinned to the same N cores (taskset), wrk to others, the origin to its own core:
#   ceiling (bench-ceiling, bare hyper), lacquerd, NGINX proxy_cache, Varnish -s malloc.
# Hits on a cached 2 KiB HLS manifest for an identity client and a gzip client, interleaved rounds;
# misses (every request a new URL) at one N.
# Bundle: BUNDLE (default: bundle.tar.xz beside this script, else .scale/bundle.tar.xz under the working
# directory), made by bench/scale/make-bundle.sh, which also copies this script beside it:
#   bench/scale/make-bundle.sh target/release .scale/bundle.tar.xz   # here, from the repository root
#   bash .scale/scale.sh                                             # there, from the repository root
# Or set BUNDLE_DIR to a folder where it is already unpacked (bin/, lib/). On a machine with everything
# installed, set BUNDLE_DIR to a folder whose bin/ holds the project's release binaries (and PATH finds the rest).
# Env: NS ("1 2 4 8": each target pinned to 1, 2, 4 and 8 cores), ROUNDS (3), DUR (3s), CONNS (400),
#      WRK_CORES (8-14), ORIGIN_CORE (15), MISS_N (4), OUT (results folder, default /tmp/scale-out).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/scale-out}; mkdir -p "$OUT"
B=${BUNDLE_DIR:-/tmp/b}
if [ ! -x "$B/bin/lacquerd" ]; then
  BUNDLE=${BUNDLE:-$HERE/bundle.tar.xz}
  [ -f "$BUNDLE" ] || BUNDLE=$PWD/.scale/bundle.tar.xz
  [ -f "$BUNDLE" ] || { echo "no bundle: make one with bench/scale/make-bundle.sh, or set BUNDLE or BUNDLE_DIR" >&2; exit 2; }
  mkdir -p "$B"; tar -xJf "$BUNDLE" -C "$B" || exit 2
fi
mkdir -p /var/lib/nginx/body /var/lib/nginx/proxy /var/lib/nginx/fastcgi /var/lib/nginx/uwsgi /var/lib/nginx/scgi 2>/dev/null
export PATH=$B/bin:$PATH LD_LIBRARY_PATH=$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
NS=${NS-"1 2 4 8"}; ROUNDS=${ROUNDS:-3}; DUR=${DUR:-3s}; CONNS=${CONNS:-400}
WRK_CORES=${WRK_CORES:-8-14}; ORIGIN_CORE=${ORIGIN_CORE:-15}; MISS_N=${MISS_N:-4}
WRK_T=$(python3 -c "a,b='$WRK_CORES'.split('-') if '-' in '$WRK_CORES' else ('$WRK_CORES','$WRK_CORES'); print(int(b)-int(a)+1)")
W=$(mktemp -d -t scale.XXXXXX); chmod 755 "$W"
log() { echo "$*" | tee -a "$OUT/scale.log"; }
PIDS=()
stop_all() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; sleep 1; for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done; wait 2>/dev/null; PIDS=(); }
trap stop_all EXIT
ulimit -n 200000 2>/dev/null || ulimit -n 65536 2>/dev/null || true

log "== $(date -u +%FT%TZ) $(nproc) cores; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2); load $(cut -d' ' -f1-3 /proc/loadavg)"
log "NS=\"$NS\" ROUNDS=$ROUNDS DUR=$DUR CONNS=$CONNS WRK_CORES=$WRK_CORES ORIGIN_CORE=$ORIGIN_CORE MISS_N=$MISS_N OUT=$OUT"
[ "$(nproc)" -gt "$ORIGIN_CORE" ] || log "warning: $(nproc) cores, but the origin is pinned to core $ORIGIN_CORE and wrk to $WRK_CORES (set ORIGIN_CORE, WRK_CORES, NS)"
for b in lacquerd bench-ceiling bench-origin nginx varnishd wrk etcd etcdctl gcc; do command -v $b >/dev/null || log "missing: $b"; done
log "$(nginx -v 2>&1) | $(varnishd -V 2>&1 | head -1) | $(wrk -v 2>&1 | head -1) | $(lacquerd --version 2>&1 | head -1)"

get() { python3 - "$1" <<'PY'
import sys, urllib.request
try:
    r = urllib.request.urlopen(sys.argv[1], timeout=5); r.read(); print(r.status)
except Exception as e:
    print(getattr(e, "code", "ERR"))
PY
}
wait_port() { for _ in $(seq 100); do [ "$(get "http://127.0.0.1:$1/hls/warm.m3u8")" = 200 ] && return 0; sleep 0.1; done; log "port $1 never answered"; return 1; }

taskset -c "$ORIGIN_CORE" bench-origin 18080 18081 >"$W/origin.log" 2>&1 & PIDS+=($!)
sleep 0.5
ORIGIN_PID=${PIDS[0]}
echo 'wrk.headers["Accept-Encoding"] = "gzip, deflate, br"' >"$W/gzip.lua"
declare -A PORT=([ceiling]=16089 [lacquer]=16085 [nginx]=16083 [varnish]=16081)

start_targets() {  # $1 = N cores (0..N-1)
  local n=$1 c="0-$(( $1 - 1 ))"
  taskset -c "$c" bench-ceiling 16089 "$n" >"$W/ceiling.log" 2>&1 & PIDS+=($!)
  rm -rf "$W/lq"; mkdir -p "$W/lq"
  printf '[server]\nworkers = %s\n' "$n" >"$W/lq.toml"
  taskset -c "$c" lacquerd --config "$W/lq.toml" --listen 127.0.0.1:16085 --backend 127.0.0.1:18080 \
    --admin 127.0.0.1:16086 --memory 1GiB --disk "$W/lq" --disk-size 4GiB >"$W/lacquer-$n.log" 2>&1 & PIDS+=($!)
  rm -rf "$W/nginx"; mkdir -p "$W/nginx"
  cat >"$W/nginx/nginx.conf" <<NGX
worker_processes $n;
pid nginx.pid;
error_log error.log warn;
events { worker_connections 65536; }
http {
    access_log off;
    proxy_cache_path cache levels=1:2 keys_zone=rig:64m max_size=4g inactive=1d use_temp_path=off;
    upstream origin { server 127.0.0.1:18080; keepalive 256; }
    server {
        listen 127.0.0.1:16083 reuseport backlog=65535;
        location / {
            proxy_pass http://origin;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_cache rig;
            proxy_cache_lock on;
            add_header X-Cache \$upstream_cache_status;
        }
    }
}
NGX
  taskset -c "$c" nginx -p "$W/nginx" -c nginx.conf -g 'daemon off;' >"$W/nginx-$n.log" 2>&1 & PIDS+=($!)
  printf 'vcl 4.1;\nbackend origin { .host = "127.0.0.1"; .port = "18080"; }\n' >"$W/v.vcl"
  taskset -c "$c" varnishd -F -j none -n "$W/varnish-$n" -a 127.0.0.1:16081 -T 127.0.0.1:16082 -f "$W/v.vcl" \
    -s malloc,1g -p thread_pools="$n" -p thread_pool_min=200 >"$W/varnish-$n.log" 2>&1 & PIDS+=($!)
  sleep 2
  TARGETS=""
  for t in ceiling lacquer nginx varnish; do
    if wait_port "${PORT[$t]}"; then TARGETS="$TARGETS $t"; else tail -5 "$W/$t-$n.log" 2>/dev/null | tee -a "$OUT/scale.log"; fi
  done
}
stop_targets() { local keep=$ORIGIN_PID; for p in "${PIDS[@]}"; do [ "$p" = "$keep" ] || kill "$p" 2>/dev/null; done
  sleep 1; for p in "${PIDS[@]}"; do [ "$p" = "$keep" ] || kill -9 "$p" 2>/dev/null; done; PIDS=("$keep"); sleep 1; }

rps_of() { awk '/Requests\/sec/ {print $2}'; }
p99_of() { awk '$1=="99%" {v=$2; if (v ~ /us$/) {sub("us","",v); v=v/1000} else if (v ~ /ms$/) {sub("ms","",v)} else if (v ~ /s$/) {sub("s","",v); v=v*1000}; print v}'; }

echo "n class round target rps p99ms" >"$OUT/hits.txt"
for n in $NS; do
  start_targets "$n"
  log "N=$n targets:$TARGETS"
  for t in $TARGETS; do for _ in 1 2 3; do get "http://127.0.0.1:${PORT[$t]}/hls/scale.m3u8" >/dev/null; get "http://127.0.0.1:${PORT[$t]}/hls/scale.m3u8" >/dev/null; done; done
  for class in identity gzip; do
    args=""; [ "$class" = gzip ] && args="-s $W/gzip.lua"
    for r in $(seq "$ROUNDS"); do
      for t in $TARGETS; do
        out=$(taskset -c "$WRK_CORES" wrk -t"$WRK_T" -c"$CONNS" -d"$DUR" --latency $args "http://127.0.0.1:${PORT[$t]}/hls/scale.m3u8" 2>&1)
        echo "$n $class $r $t $(rps_of <<<"$out") $(p99_of <<<"$out")" | tee -a "$OUT/hits.txt"
      done
    done
  done
  if [ "$n" = "$MISS_N" ]; then
    echo "n round target rps p99ms" >"$OUT/misses.txt"
    for r in $(seq "$ROUNDS"); do
      for t in lacquer nginx varnish; do
        case " $TARGETS " in *" $t "*) ;; *) continue ;; esac
        printf 'local n = 0\nrequest = function() n = n + 1; return wrk.format("GET", "/new/%s-%s-" .. n .. "-" .. math.random(1e9)) end\n' "$t" "$r" >"$W/m.lua"
        out=$(taskset -c "$WRK_CORES" wrk -t"$WRK_T" -c200 -d"$DUR" --latency -s "$W/m.lua" "http://127.0.0.1:${PORT[$t]}" 2>&1)
        echo "$n $r $t $(rps_of <<<"$out") $(p99_of <<<"$out")" | tee -a "$OUT/misses.txt"
      done
    done
  fi
  stop_targets
done

python3 - "$OUT/hits.txt" <<'PY' | tee -a "$OUT/scale.log"
import sys, statistics as st
rows = [l.split() for l in open(sys.argv[1]).read().splitlines()[1:] if len(l.split()) == 6]
by = {}
for n, c, r, t, rps, p99 in rows:
    by.setdefault((int(n), c, int(r)), {})[t] = float(rps or 0)
ns = sorted({k[0] for k in by}); classes = ["identity", "gzip"]
print("| N cores | client | ceiling rps | lacquer rps | nginx rps | varnish rps | lacquer/nginx | lacquer/ceiling | lacquer/varnish | lacquer rps per core |")
print("|---|---|---|---|---|---|---|---|---|---|")
for n in ns:
    for c in classes:
        rs = [by[k] for k in by if k[0] == n and k[1] == c]
        med = lambda t: st.median(x.get(t, 0) for x in rs)
        rat = lambda a, b: st.median(x.get(a, 0) / x[b] for x in rs if x.get(b))  if any(x.get(b) for x in rs) else 0
        print(f"| {n} | {c} | {med('ceiling'):.0f} | {med('lacquer'):.0f} | {med('nginx'):.0f} | {med('varnish'):.0f} | "
              f"{rat('lacquer','nginx'):.2f} | {rat('lacquer','ceiling'):.2f} | {rat('lacquer','varnish'):.2f} | {med('lacquer')/n:.0f} |")
PY

log "== done $(date -u +%FT%TZ)"
