#!/bin/sh
# Runs inside the container booted by packaging/test-under-systemd, as root, then powers it off.
set -ux
trap 'poweroff' EXIT
cd /root
fail() { echo "check: FAILED: $*"; exit 1; }
dpkg --purge lacquer >/dev/null 2>&1
mkdir -p /srv/origin && echo "hello from the origin" >/srv/origin/index.html
cat >/etc/systemd/system/origin.service <<'UNIT'
[Service]
ExecStart=/usr/bin/python3 -m http.server --bind 127.0.0.1 --directory /srv/origin 8080
UNIT
systemctl daemon-reload
systemctl start origin
apt-get install -y -qq ./lacquer.deb || fail "apt install"
sleep 2
systemctl is-active lacquer || fail "not active after install"
curl -s -D - -o /dev/null http://127.0.0.1:6081/ | grep -qi "x-cache: MISS" || fail "first request"
curl -s -D - -o /dev/null http://127.0.0.1:6081/ | grep -qi "x-cache: HIT" || fail "second request"
cachectl stats | grep "hit ratio" || fail "cachectl without flags"
sed -i 's/^# default_ttl = "0s"/default_ttl = "5m"/' /etc/lacquer/lacquer.toml
systemctl reload lacquer || fail "reload of a good file"
sed -i 's/^default_ttl = "5m"/default_ttl = "soon"/' /etc/lacquer/lacquer.toml
systemctl reload lacquer && fail "reload of a bad file succeeded"
systemctl is-active lacquer || fail "a refused reload stopped the service"
sed -i 's/^default_ttl = "soon"/# default_ttl = "0s"/' /etc/lacquer/lacquer.toml
status=/proc/$(systemctl show -p MainPID --value lacquer)/status
grep -E "^(Uid|CapEff|CapAmb|NoNewPrivs|Seccomp):" "$status"
grep -q "^CapEff:.*0000000000000400$" "$status" || fail "capabilities beyond CAP_NET_BIND_SERVICE"
grep -q "^NoNewPrivs:.*1$" "$status" || fail "NoNewPrivs"
grep -q "^Seccomp:.*2$" "$status" || fail "no system call filter"
systemctl restart lacquer
sleep 2
systemctl is-active lacquer || fail "restart"
journalctl -u lacquer --no-pager | grep -E "reloaded|reload refused|stopped" | tail -3
systemd-analyze security lacquer --no-pager | tail -1
apt-get purge -y -qq lacquer >/dev/null
[ ! -e /etc/lacquer ] && [ ! -e /var/lib/lacquer ] || fail "purge left files"
echo "check: ok"
