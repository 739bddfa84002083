# Shared by the demo and benchmark scripts (sourced, not run).

BIN=${BIN:-target/release/vectorlb}
TOOLS=${TOOLS:-target/release/vectorlb-tools}

# The [runtime] section and the LB's two AF_XDP ports (ext0 10.0.0.1/24, int0 10.1.0.1/24).
#   lb_base_config DIR [EXTRA_RUNTIME_LINE ...]
lb_base_config() {
    local dir=$1
    shift
    printf '[runtime]\napi = "unix:%s/api.sock"\nrun_dir = "%s"\n' "$dir" "$dir"
    local l
    for l in "$@"; do printf '%s\n' "$l"; done
    cat <<'CONF'

[[ports]]
name = "ext"
device = "net_af_xdp0,iface=ext0"
addrs = ["10.0.0.1/24"]

[[ports]]
name = "int"
device = "net_af_xdp1,iface=int0"
addrs = ["10.1.0.1/24"]

CONF
}

# The generator topology's LB: full NAT of UDP and TCP to one backend whose MAC is the generator's
# second port, one busy-polling worker pinned to CPU 1.
#   gen_lb_config DIR G1_MAC
gen_lb_config() {
    lb_base_config "$1" "idle_sleep_us = 0" "cpus = [1]" "queue_desc = ${LB_QUEUE_DESC:-2048}"
    printf '[[neighbors]]\nip = "10.1.0.11"\nmac = "%s"\n' "$2"
    local proto la=200
    for proto in udp tcp; do
        cat <<CONF

[[services]]
vip = "10.0.0.100"
port = 9
proto = "$proto"
mode = "fnat"
scheduler = "rr"
local_addrs = ["10.1.0.$la"]
backends = [{ addr = "10.1.0.11", port = 9 }]
CONF
        la=$((la + 1))
    done
}

# Starts `vectorlb run` in namespace NS with CONFIG (log in DIR/lb.log), sets LB_PID, and waits
# until its API (unix:DIR/api.sock) answers.
#   start_lb NS CONFIG DIR
start_lb() {
    ip netns exec "$1" "$BIN" run --config "$2" > "$3/lb.log" 2>&1 &
    LB_PID=$!
    local _
    for _ in $(seq 100); do
        "$BIN" ctl --api "unix:$3/api.sock" --raw GET /v1/health >/dev/null 2>&1 && return 0
        kill -0 "$LB_PID" 2>/dev/null || { echo "vectorlb run exited:" >&2; cat "$3/lb.log" >&2; return 1; }
        sleep 0.1
    done
    echo "vectorlb run did not come up" >&2
    return 1
}

# Stops the daemon start_lb started (SIGTERM: it withdraws, hands its sessions over and exits),
# waiting up to 5 s; nothing to do when it is not running.
stop_lb() {
    [ -n "${LB_PID:-}" ] && kill -0 "$LB_PID" 2>/dev/null || return 0
    kill -TERM "$LB_PID" 2>/dev/null || true
    local _
    for _ in $(seq 50); do kill -0 "$LB_PID" 2>/dev/null || return 0; sleep 0.1; done
}

# nginx in backend namespace NS, its files in DIR, with SERVER as the server block's body.
#   start_nginx NS DIR 'listen 80; location / { return 200 "be1\n"; }'
start_nginx() {
    local ns=$1 d=$2 server=$3
    mkdir -p "$d"
    cat > "$d/nginx.conf" <<CONF
worker_processes 1;
pid $d/nginx.pid;
error_log $d/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $d/body; proxy_temp_path $d/proxy; fastcgi_temp_path $d/fcgi;
    uwsgi_temp_path $d/uwsgi; scgi_temp_path $d/scgi;
    default_type text/plain;
    server { $server }
}
CONF
    ip netns exec "$ns" nginx -c "$d/nginx.conf" -p "$d"
}

# dpdk-testpmd io-forward between ext0 and int0 in namespace NS (the I/O ceiling on the
# generator topology); sets TP_PID. Stop it with stop_testpmd.
#   start_testpmd NS DIR
start_testpmd() {
    # testpmd leaves its prompt when stdin closes: hold it open with a sleeping writer.
    mkfifo "$2/tp.in" 2>/dev/null || true
    (exec sleep 100000) > "$2/tp.in" &
    TP_HOLD=$!
    ip netns exec "$1" dpdk-testpmd -l 0,1 --in-memory --log-level '*:error' --file-prefix "$1-tp" \
        --vdev net_af_xdp0,iface=ext0 --vdev net_af_xdp1,iface=int0 -- \
        --forward-mode=io --auto-start --nb-cores=1 --rxd="${LB_QUEUE_DESC:-2048}" --txd="${LB_QUEUE_DESC:-2048}" < "$2/tp.in" > "$2/testpmd.log" 2>&1 &
    TP_PID=$!
    sleep 3
    kill -0 "$TP_PID" 2>/dev/null || { echo "dpdk-testpmd exited:" >&2; cat "$2/testpmd.log" >&2; return 1; }
}

stop_testpmd() {
    kill -INT "$TP_PID" 2>/dev/null || true
    wait "$TP_PID" 2>/dev/null || true
    kill "$TP_HOLD" 2>/dev/null || true
}
