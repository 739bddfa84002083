#!/usr/bin/env bash
# The end of `make test`: no process a test started may outlive the run. Lists (and ends)
# every process running a binary of this checkout's target/ directory, or one started inside a
# test's network namespace whose namespace is gone; exits 1 if there was any.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
self=$$
left=()
for d in /proc/[0-9]*; do
    pid=${d#/proc/}
    [ "$pid" = "$self" ] && continue
    exe=$(readlink "$d/exe" 2>/dev/null) || continue
    case "$exe" in
        "$root"/target/*) left+=("$pid") ;;
    esac
done
if [ ${#left[@]} -eq 0 ]; then
    echo "leftovers: no process of the tests is left"
    exit 0
fi
echo "leftovers: ${#left[@]} processes the tests started are still running:"
for pid in "${left[@]}"; do
    printf '  %s %s\n' "$pid" "$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | cut -c1-200)"
done
kill -9 "${left[@]}" 2>/dev/null || true
exit 1
