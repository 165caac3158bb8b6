#!/usr/bin/env bash
# Build lmx twice (optimised, and with AddressSanitizer + UndefinedBehaviorSanitizer) and run every
# test in both.  Fixtures come from ../shared/fixtures (override with LMX_FIXTURES=/path).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)
fixtures=${LMX_FIXTURES:-$(cd .. && pwd)/shared/fixtures}
status=0

run_suite() { # name, cmake options...
    local dir=build-$1; shift
    echo "== $dir: $*"
    cmake -S . -B "$dir" -DLMX_FIXTURES="$fixtures" "$@" >/dev/null
    cmake --build "$dir" -j"$jobs" >/dev/null
    (cd "$dir" && ctest --output-on-failure -j"$jobs") || status=1
}

run_suite release -DCMAKE_BUILD_TYPE=Release
ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
    run_suite sanitize -DCMAKE_BUILD_TYPE=Debug -DLMX_SANITIZE=ON
exit $status
