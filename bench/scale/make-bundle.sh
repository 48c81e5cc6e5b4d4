#!/usr/bin/env bash
# Packs what bench/scale/scale.sh needs to run on a bare many-core machine (one with no NGINX, Varnish or wrk
# installed, such as a borrowed many-core box): stripped release binaries of the project (lacquerd, bench-ceiling,
# bench-origin: the debug info of target/release/lacquerd, about 200 MB, is left out), Debian's nginx, varnishd and
# wrk (etcd and etcdctl too when installed), and the libraries a bare Ubuntu/Debian image may lack. It copies
# scale.sh beside the bundle, so that the folder holds all a run needs. About 20 MiB; it fails above 64 MiB.
# usage, from the repository root, after cargo build --release -p lacquerd -p bench-origin -p bench-ceiling:
#   bench/scale/make-bundle.sh target/release .scale/bundle.tar.xz
#   (there:) bash .scale/scale.sh
# Needs here: apt-get install nginx varnish wrk (their services may stay disabled).
set -eu
[ $# -eq 2 ] || { sed -n '2,10p' "$0" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
rel=$1; out=$2
for x in lacquerd bench-ceiling bench-origin; do
  [ -x "$rel/$x" ] || { echo "missing $rel/$x: cargo build --release -p lacquerd -p bench-origin -p bench-ceiling" >&2; exit 2; }
done
mkdir -p "$(dirname "$out")"
b=$(mktemp -d); chmod 755 "$b"
trap 'rm -rf "$b"' EXIT
mkdir -p "$b/bin" "$b/lib"
for x in lacquerd bench-ceiling bench-origin; do strip -o "$b/bin/$x" "$rel/$x"; done
for x in /usr/sbin/nginx /usr/sbin/varnishd /usr/bin/wrk; do
  [ -x "$x" ] || { echo "missing $x: apt-get install nginx varnish wrk" >&2; exit 2; }
  cp "$x" "$b/bin/"
done
for x in /usr/bin/etcd /usr/bin/etcdctl; do [ -x "$x" ] && cp "$x" "$b/bin/"; done
for l in libjemalloc.so.2 libluajit-5.1.so.2 libpcre2-8.so.0 libcrypt.so.1; do cp -L "/lib/x86_64-linux-gnu/$l" "$b/lib/"; done
tar -cJf "$out" -C "$b" .
dir=$(cd "$(dirname "$out")" && pwd)
[ "$dir/scale.sh" -ef "$here/scale.sh" ] || cp "$here/scale.sh" "$dir/scale.sh"
ls -la "$out" "$dir/scale.sh"
total=$(du -cb "$out" "$dir/scale.sh" | tail -1 | cut -f1)
echo "bundle and script: $((total / 1024 / 1024)) MiB ($total bytes)"
if [ "$total" -ge $((64 * 1024 * 1024)) ]; then
  echo "over 64 MiB: too large to carry to the many-core machine" >&2
  exit 1
fi
# The folder must travel with the checkout but stay out of git: say so when git would see it.
if git -C "$dir" rev-parse --is-inside-work-tree >/dev/null 2>&1 && ! git -C "$dir" check-ignore -q "$out"; then
  echo "note: $out is not ignored by git; e.g. echo /.scale/ >> .git/info/exclude" >&2
fi
