#!/usr/bin/env bash
# Build lmx twice (optimised, and with AddressSanitizer + UndefinedBehaviorSanitizer) and run every
# test in both, after installing what a fresh Debian machine lacks (scripts/setup.sh).  Fixtures
# come from ../shared/fixtures (override with LMX_FIXTURES=/path).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh          # the Debian packages a fresh machine lacks (as root, through sudo, or named)
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
# Every fuzz harness for a bounded time (15 s each; LMX_FUZZ_SECONDS=0 only replays the corpora).
scripts/fuzz.sh || status=1
exit $status
