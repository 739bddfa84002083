#!/usr/bin/env bash
# Polling that fits the host: the daemon's CPU use with no traffic, and the round trip of a
# ping to the VIP (answered by the LB itself), with idle back-off (the default,
# idle_sleep_us = 200) and with pure busy polling (idle_sleep_us = 0). One JSON line per mode.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
P=vlbidle
DIR=$(mktemp -d /tmp/vectorlb-idle.XXXXXX)
trap 'rc=$?; [ $rc -ne 0 ] && cat "$DIR/lb.log" >&2; pkill -f "$DIR/lb" 2>/dev/null || true; bash scripts/netns.sh down $P >/dev/null 2>&1; rm -rf "$DIR"; exit $rc' EXIT
bash scripts/netns.sh up "$P" two-arm
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
for sleep_us in 200 0; do
    { lb_base_config "$DIR" "mbufs = 8191" "idle_sleep_us = $sleep_us"; cat <<CONF
[[services]]
vip = "10.0.0.100"
port = 80
proto = "tcp"
mode = "fnat"
local_addrs = ["10.1.0.200"]
backends = [{ addr = "10.1.0.11", port = 80 }]
CONF
    } > "$DIR/lb$sleep_us.toml"
    start_lb "$P-lb" "$DIR/lb$sleep_us.toml" "$DIR"
    pid=$LB_PID
    sleep 3
    hz=$(getconf CLK_TCK)
    t0=$(ticks $pid); sleep 5; t1=$(ticks $pid)
    cpu=$(awk -v a="$t0" -v b="$t1" -v hz="$hz" 'BEGIN {printf "%.1f", (b - a) / hz / 5 * 100}')
    rtt=$(ip netns exec "$P-cl" ping -c 50 -i 0.05 -q 10.0.0.100 | sed -n 's|.*= \([0-9.]*\)/\([0-9.]*\)/\([0-9.]*\)/.*|\1,\2,\3|p')
    IFS=, read -r rmin ravg rmax <<<"$rtt"
    echo "{\"bench\":\"idle\",\"idle_sleep_us\":$sleep_us,\"idle_cpu_percent\":$cpu,\"ping_rtt_ms_min\":$rmin,\"ping_rtt_ms_avg\":$ravg,\"ping_rtt_ms_max\":$rmax}"
    kill -TERM $pid; wait $pid || true
done
