#!/usr/bin/env bash
# The memif tests that play a hostile peer (and the protocol tests) in an AddressSanitizer
# build. Stable rustc builds with -Zsanitizer=address under RUSTC_BOOTSTRAP=1 (the sanitizer
# runtime ships with the x86_64 standard library); the target is given so that build scripts
# and proc macros stay uninstrumented. A canary first proves the build is instrumented.
set -euo pipefail
cd "$(dirname "$0")/.."
export RUSTC_BOOTSTRAP=1 RUSTFLAGS="-Zsanitizer=address" CARGO_TARGET_DIR=target/asan
# Leak checking needs ptrace, which containers often refuse; overflows are what we look for.
export ASAN_OPTIONS=detect_leaks=0
T=x86_64-unknown-linux-gnu
mkdir -p target/asan
if cargo run -q -p vectorlb-memif --target $T --example asan_canary > target/asan/canary.log 2>&1; then
    echo "asan-memif: the canary's overflow went unreported: not an ASan build" >&2
    cat target/asan/canary.log >&2
    exit 1
fi
grep -q "AddressSanitizer: heap-buffer-overflow" target/asan/canary.log || {
    echo "asan-memif: the canary failed without an ASan report:" >&2
    cat target/asan/canary.log >&2
    exit 1
}
echo "asan-memif: canary caught (heap-buffer-overflow); running the tests under ASan"
cargo test -p vectorlb-memif --target $T --test hostile --test protocol
