#!/usr/bin/env bash
# `make demo-scale-out`: three active vectorlb nodes behind a router running FRR. Each node
# announces the VIPs by BGP through its own BIRD; the router spreads the flows over them by
# ECMP (L4 hash). Long-lived connections run (DR, TUN and full-NAT services, IPv4 and IPv6; the
# TUN backends open the tunnels with `vectorlb decap`; the full-NAT sessions are synchronised in
# the group and a dead node's local addresses are taken over by its peers' backup routes) while
# one node is killed (SIGKILL) and another is drained (`vectorlb ctl drain`); the demo prints
# what the router saw and what broke.
#
#   client --- router (FRR, ECMP) --- lb1, lb2, lb3 (vectorlb + BIRD) --- be1..be3
#
# Everything it creates is removed on exit. Last line:
#   SCALE-OUT OK connections=<n> broken=<n> new_failed=<n> kill_withdrawn_ms=<n> drain_withdrawn_ms=<n>
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
P=vlbso
DIR=$(mktemp -d /tmp/vectorlb-scale-out.XXXXXX)
CONNS=${SCALE_OUT_CONNECTIONS:-600}
PIDS=()

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    sleep 0.3
    bash scripts/netns.sh down "$P" >/dev/null 2>&1 || true
    if [ $rc -ne 0 ]; then
        echo "scale-out demo failed (exit $rc); logs:" >&2
        tail -5 "$DIR"/*/lb.log >&2 2>/dev/null || true
    fi
    rm -rf "$DIR"
    exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM
say() { printf '\n== %s\n' "$*"; }
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
paths() { ip netns exec "$P-rt" ip -4 route show 10.100.0.1 | grep -o 'via [0-9.]*' | awk '{print $2}' | tr '\n' ' '; }
npaths() { paths | wc -w; }

say "topology: client | router (FRR: bgpd, bfdd, zebra; ECMP by L4 hash) | lb1 lb2 lb3 | be1 be2 be3"
bash scripts/netns.sh up "$P" scale
for i in 1 2 3; do
    ip netns exec "$P-be$i" "$TOOLS" probe serve-tcp --listen "[::]:9000" --name "be$i" >/dev/null 2>&1 &
    PIDS+=($!)
    disown
    ip netns exec "$P-be$i" "$BIN" decap attach eth0 --from 10.1.0.0/24 --from 2001:db8:1::/64 | sed "s/^/be$i: /"
done

for k in 1 2 3; do
    mkdir -p "$DIR/lb$k"
    svc() { printf '[[services]]\nvip = "%s"\nport = 9000\nproto = "tcp"\nmode = "%s"\nscheduler = "maglev"\n%s\nbackends = [%s]\n\n' "$1" "$2" "${4:-}" "$3"; }
    peers=() lp4=() lp6=()
    for n in 1 2 3; do
        [ "$n" = "$k" ] && continue
        peers+=("\"10.1.0.25$n:7946\"") lp4+=("\"10.200.0.$n\"") lp6+=("\"2001:db8:200::$n\"")
    done
    join() { local IFS=,; echo "$*"; }
    B4='{ addr = "10.1.0.11" }, { addr = "10.1.0.12" }, { addr = "10.1.0.13" }'
    B6='{ addr = "2001:db8:1::11" }, { addr = "2001:db8:1::12" }, { addr = "2001:db8:1::13" }'
    {
        printf '[global]\ncluster_key = "demo-cluster-key-0123"\n\n'
        printf '[runtime]\napi = "unix:%s/api.sock"\nrun_dir = "%s"\nmbufs = 16383\nidle_sleep_us = 100\n\n' "$DIR/lb$k" "$DIR/lb$k"
        printf '[bgp]\nasn = 65001\nrouter_id = "10.1.0.25%s"\nbfd_multiplier = 20\n' "$k"
        printf '[[bgp.neighbors]]\naddress = "10.1.0.254"\nasn = 65000\n[[bgp.neighbors]]\naddress = "2001:db8:1::254"\nasn = 65000\n\n'
        printf '[ha]\nsync_listen = "10.1.0.25%s:7946"\nsync_peers = [%s]\nsync_key = "demo-group-sync-key"\ngroup = true\n\n' "$k" "$(join "${peers[@]}")"
        printf '[[ports]]\nname = "int"\ndevice = "net_af_xdp0,iface=int0"\naddrs = ["10.1.0.%s/24", "2001:db8:1::%s/64"]\n\n' "$k" "$k"
        printf '[[routes]]\nprefix = "0.0.0.0/0"\nvia = "10.1.0.254"\nport = "int"\n\n[[routes]]\nprefix = "::/0"\nvia = "2001:db8:1::254"\nport = "int"\n\n'
        svc 10.100.0.1 dr "$B4"; svc 2001:db8:100::1 dr "$B6"; svc 10.100.0.2 tun "$B4"; svc 2001:db8:100::2 tun "$B6"
        # Full NAT: this node's local address, the peers' as backup routes.
        svc 10.100.0.4 fnat "${B4//\}/, port = 9000 \}}" "$(printf 'local_addrs = ["10.200.0.%s"]\npeer_local_addrs = [%s]\n' "$k" "$(join "${lp4[@]}")")"
        svc 2001:db8:100::4 fnat "${B6//\}/, port = 9000 \}}" "$(printf 'local_addrs = ["2001:db8:200::%s"]\npeer_local_addrs = [%s]\n' "$k" "$(join "${lp6[@]}")")"
    } > "$DIR/lb$k/lb.toml"
    ip netns exec "$P-lb$k" "$BIN" run --config "$DIR/lb$k/lb.toml" > "$DIR/lb$k/lb.log" 2>&1 &
    PIDS+=($!)
    eval "LB$k=$!"
    disown
done
say "three nodes started; waiting for the router to take their routes"
for _ in $(seq 150); do [ "$(npaths)" = 3 ] && break; sleep 0.2; done
[ "$(npaths)" = 3 ] || { echo "the router has $(npaths) paths to the VIP" >&2; exit 1; }
ip netns exec "$P-rt" ip route show 10.100.0.1
"$BIN" ctl --api "unix:$DIR/lb1/api.sock" bgp

say "$CONNS long-lived connections (DR, TUN and full NAT, IPv4 and IPv6) and 20 new ones a second, for 16 s"
ip netns exec "$P-cl" "$TOOLS" probe hold --target "10.100.0.1:9000,[2001:db8:100::1]:9000,10.100.0.2:9000,[2001:db8:100::2]:9000,10.100.0.4:9000,[2001:db8:100::4]:9000" \
    --connections "$CONNS" --streaming $((CONNS / 5)) --interval-ms 100 --seconds 16 --new-per-second 20 \
    --ready-file "$DIR/ready" > "$DIR/hold.json" &
HOLD=$!
for _ in $(seq 600); do [ -f "$DIR/ready" ] && break; sleep 0.1; done
for k in 1 2 3; do echo "lb$k: $("$BIN" ctl --api "unix:$DIR/lb$k/api.sock" --global-stats | grep '"sessions"' | tr -d ' ,')"; done
sleep 3

say "SIGKILL lb1"
t0=$(now_ms)
kill -9 "$LB1"
while paths | grep -q 10.1.0.251; do sleep 0.005; done
KILL_MS=$(( $(now_ms) - t0 ))
echo "the router withdrew lb1's route after $KILL_MS ms; paths now: $(paths)"
sleep 1
echo "lb1's full-NAT local address, now through its peers' backup routes:"
ip netns exec "$P-rt" ip route show 10.200.0.1
sleep 3

say "vectorlb ctl drain lb2"
t0=$(now_ms)
"$BIN" ctl --api "unix:$DIR/lb2/api.sock" drain --deadline 30
while paths | grep -q 10.1.0.252; do sleep 0.005; done
DRAIN_MS=$(( $(now_ms) - t0 ))
echo "the router withdrew lb2's route after $DRAIN_MS ms; paths now: $(paths) (lb2 still serves what reaches it)"

wait "$HOLD"
say "what broke"
cat "$DIR/hold.json"
r=$(cat "$DIR/hold.json")
num() { echo "$r" | grep -o "\"$1\":[0-9]*" | head -1 | cut -d: -f2; }
BROKEN=$(num broken)
NEWFAILED=$(echo "$r" | grep -o '"failed":[0-9]*' | head -1 | cut -d: -f2)
echo "lb3 continued $("$BIN" ctl --api "unix:$DIR/lb3/api.sock" --global-stats | grep '"continued"' | tr -dc '0-9') flows that reached it without a session"
[ "$BROKEN" = 0 ] && [ "$NEWFAILED" = 0 ] || { echo "connections broke: $r" >&2; exit 1; }
echo "SCALE-OUT OK connections=$CONNS broken=$BROKEN new_failed=$NEWFAILED kill_withdrawn_ms=$KILL_MS drain_withdrawn_ms=$DRAIN_MS"
