#!/usr/bin/env bash
# Runs the cargo-fuzz targets in fuzz/ for a fixed number of iterations each.
#
#   scripts/fuzz.sh                      # every target (`cargo fuzz list`), 1,000,000 runs each
#   scripts/fuzz.sh parse_frame arp      # just these targets
#   FUZZ_RUNS=10000 scripts/fuzz.sh      # fewer runs
#
# Environment:
#   FUZZ_RUNS       iterations per target (libFuzzer -runs=N); default 1000000
#   FUZZ_SANITIZER  address (default) | none | ...  passed to `cargo fuzz -s`
#   FUZZ_ARGS       extra libFuzzer flags, e.g. "-max_len=4096 -timeout=10"
#   CARGO_BUILD_JOBS  limits build parallelism as usual (e.g. 1 on a shared machine)
#
# Works from any directory. Prints one summary line per target and exits non-zero if any target
# crashed (the input is saved under fuzz/artifacts/<target>/, logs under fuzz/target/fuzz-logs/).
# The `pipeline` and `config` seed corpora are generated (fuzz/examples/seeds.rs) when missing;
# a dictionary fuzz/dicts/<target>.dict, if present, is passed as -dict=.
#
# Toolchain: cargo-fuzz passes nightly-only flags (-Zsanitizer=..., -Cpasses=sancov-module, ...),
# so on a stable toolchain we set RUSTC_BOOTSTRAP=1. With Rust 1.95 stable that is enough for
# AddressSanitizer builds. If the sanitizer build fails anyway (some stable toolchains ship no
# sanitizer runtime, or refuse mixing sanitized code with the uninstrumented std), the script
# falls back to `-s none`: plain libFuzzer with panics/overflow checks, no ASan.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

export RUSTC_BOOTSTRAP=1
runs="${FUZZ_RUNS:-1000000}"
sanitizer="${FUZZ_SANITIZER:-address}"
read -r -a extra_args <<<"${FUZZ_ARGS:-}"

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz.sh: installing cargo-fuzz" >&2
    cargo install cargo-fuzz --locked || cargo install cargo-fuzz
fi

if [ "$#" -gt 0 ]; then
    targets=("$@")
else
    mapfile -t targets < <(cargo fuzz list)
fi
if [ "${#targets[@]}" -eq 0 ]; then
    echo "fuzz.sh: no fuzz targets found" >&2
    exit 1
fi

logdir="$root/fuzz/target/fuzz-logs"
mkdir -p "$logdir"

# Build everything first so the per-target times below are fuzzing time, not compile time.
if ! cargo fuzz build -s "$sanitizer" >"$logdir/build-$sanitizer.log" 2>&1; then
    if [ "$sanitizer" != none ]; then
        echo "fuzz.sh: build with -s $sanitizer failed (see $logdir/build-$sanitizer.log); falling back to -s none" >&2
        sanitizer=none
        cargo fuzz build -s none >"$logdir/build-none.log" 2>&1 || {
            cat "$logdir/build-none.log" >&2
            exit 1
        }
    else
        cat "$logdir/build-none.log" >&2
        exit 1
    fi
fi
echo "fuzz.sh: sanitizer=$sanitizer runs=$runs targets: ${targets[*]}"

# Seed corpora that are generated rather than found: `pipeline`, `config`, `proxy_config` and `tls_peek` (see
# fuzz/examples/seeds.rs). Only when a corpus directory is missing or empty, so a grown corpus
# is never touched.
for t in "${targets[@]}"; do
    case "$t" in
        pipeline | config | proxy_config | tls_peek)
            if [ -z "$(ls -A "fuzz/corpus/$t" 2>/dev/null)" ]; then
                echo "fuzz.sh: generating seed corpora (cargo run --example seeds)"
                cargo run --quiet --manifest-path fuzz/Cargo.toml --example seeds -- fuzz/corpus \
                    >"$logdir/seeds.log" 2>&1 || { cat "$logdir/seeds.log" >&2; exit 1; }
                break
            fi
            ;;
    esac
done

failed=0
printf '%-14s %12s %8s %10s  %s\n' target runs result wall_s detail
for t in "${targets[@]}"; do
    log="$logdir/$t.log"
    start=$(date +%s.%N)
    set +e
    dict=()
    if [ -f "fuzz/dicts/$t.dict" ]; then
        dict=(-dict="fuzz/dicts/$t.dict")
    fi
    cargo fuzz run -s "$sanitizer" "$t" -- -runs="$runs" "${dict[@]}" "${extra_args[@]}" >"$log" 2>&1
    rc=$?
    set -e
    end=$(date +%s.%N)
    wall=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
    done_runs=$(sed -n 's/^Done \([0-9]*\) runs in .*/\1/p' "$log" | tail -n1)
    if [ "$rc" -eq 0 ]; then
        printf '%-14s %12s %8s %10s  %s\n' "$t" "${done_runs:-?}" ok "$wall" "log: $log"
    else
        failed=1
        artifact=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -n1)
        printf '%-14s %12s %8s %10s  %s\n' "$t" "${done_runs:--}" CRASH "$wall" \
            "rc=$rc artifact: ${artifact:-none} log: $log"
        grep -m1 -A1 -E "panicked at|ERROR: AddressSanitizer|ERROR: libFuzzer" "$log" | sed 's/^/    /' || true
        if [ -n "$artifact" ] && [ -f "$artifact" ]; then
            echo "    input (hex): $(od -An -v -tx1 "$artifact" | tr -d ' \n')"
        fi
    fi
done
exit "$failed"
