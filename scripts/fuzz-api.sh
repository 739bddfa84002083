#!/usr/bin/env bash
# Fuzzes the control API against its OpenAPI document with schemathesis (from PyPI, into a
# virtualenv under target/): every operation, schema-valid and schema-violating requests,
# all checks (no 5xx, responses match the document, invalid input rejected, valid input
# accepted unless it is semantically refused with 404/409/422). The daemon runs on DPDK's null
# devices (no network needed) and must still be running at the end.
#   scripts/fuzz-api.sh [MAX_EXAMPLES]     (default 500 per operation)
set -euo pipefail
cd "$(dirname "$0")/.."
max=${1:-500}
venv=target/schemathesis-venv
[ -x "$venv/bin/schemathesis" ] || { python3 -m venv "$venv" && "$venv/bin/pip" install -q schemathesis; }
cargo build --release --bin vectorlb
dir=$(mktemp -d /tmp/vectorlb-fuzz-api.XXXXXX)
sed "s|@DIR@|$dir|" scripts/fuzz-api/lb.toml > "$dir/lb.toml"
# A TCP API needs a token, in a file only its owner reads.
token=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
(umask 077 && printf '%s\n' "$token" > "$dir/api.token")
target/release/vectorlb run --config "$dir/lb.toml" > "$dir/lb.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true; rm -rf "$dir"' EXIT
for _ in $(seq 50); do target/release/vectorlb ctl --api 127.0.0.1:9181 --token-file "$dir/api.token" --raw GET /v1/health >/dev/null 2>&1 && break; sleep 0.1; done
rc=0
"$venv/bin/schemathesis" --config-file scripts/fuzz-api/schemathesis.toml run docs/openapi.json \
    --url http://127.0.0.1:9181 --header "Authorization: Bearer $token" --checks all --max-examples "$max" || rc=$?
if ! kill -0 $pid 2>/dev/null; then
    echo "fuzz-api: the daemon died:" >&2
    cat "$dir/lb.log" >&2
    exit 1
fi
echo "fuzz-api: daemon still running; schemathesis exit $rc"
exit $rc
