#!/usr/bin/env bash
# Fuzz every parser of user files (fuzz/, README.md "Fuzzing"): build the harnesses with
# AddressSanitizer + UndefinedBehaviorSanitizer in build-fuzz/, then for each harness replay its corpus
# (fuzz/corpus/NAME: seeds and the inputs of past crashes) and fuzz it for a bounded time.
#
#   scripts/fuzz.sh                   # what scripts/test.sh runs: 15 s per harness (LMX_FUZZ_SECONDS)
#   scripts/fuzz.sh 3600 jinja gguf   # a longer run: seconds per harness, then harness names
#   scripts/fuzz.sh 0                 # replay the corpora only
#
# With clang (CC, or clang on PATH) and its libFuzzer runtime the harnesses are libFuzzer targets
# (coverage-guided); without, they are linked with fuzz/driver.c (random mutations, same flags).
# New inputs libFuzzer finds go to build-fuzz/corpus/NAME (kept between local runs, never committed).
# A crash fails the run and leaves its input in build-fuzz/artifacts/: fix the bug, then add the input
# to fuzz/corpus/NAME/ as crash-<what> so that every later run (and ctest) replays it.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-${LMX_FUZZ_SECONDS:-15}}
[ $# -gt 0 ] && shift
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(safetensors gguf config adapter tokenizer jinja jsonl yaml)
dir=${LMX_FUZZ_BUILD:-build-fuzz}
jobs=$(nproc 2>/dev/null || echo 2)

# libFuzzer when a clang here can link a fuzz target (Debian ships its runtime in libclang-rt-*-dev).
cc=${CC:-}
if [ -z "$cc" ] && command -v clang >/dev/null 2>&1; then cc=clang; fi
engine=driver
if [ -n "$cc" ] && "$cc" --version 2>/dev/null | grep -qi clang; then
    probe=$(mktemp -d)
    printf 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { (void)d; (void)n; return 0; }\n' >"$probe/p.c"
    if "$cc" -fsanitize=fuzzer,address,undefined "$probe/p.c" -o "$probe/p" >/dev/null 2>&1; then engine=libfuzzer; fi
    rm -rf "$probe"
fi
[ $engine = libfuzzer ] || cc=${CC:-cc}
libfuzzer=$([ $engine = libfuzzer ] && echo ON || echo OFF)
echo "== fuzz ($engine, $cc): ${seconds} s per harness: ${targets[*]}"
CC=$cc cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLMX_SANITIZE=ON -DLMX_CUDA=OFF -DLMX_FUZZ=ON \
    -DLMX_FUZZ_PARSERS=ON -DLMX_LIBFUZZER="$libfuzzer" >/dev/null
cmake --build "$dir" -j"$jobs" --target fuzz_all >/dev/null

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
mkdir -p "$dir/artifacts"
status=0
for t in "${targets[@]}"; do
    case $t in gguf) dict=gguf ;; jinja) dict=jinja ;; *) dict=json ;; esac
    mkdir -p "$dir/corpus/$t"
    log=$dir/fuzz-$t.log
    if [ "$seconds" = 0 ]; then
        args=(-runs=0)
    else
        args=(-max_total_time="$seconds" -dict=fuzz/dict/$dict.dict -print_final_stats=1)
    fi
    start=$(date +%s)
    if "$dir/fuzz/fuzz_$t" "${args[@]}" -timeout=10 -rss_limit_mb=2048 -artifact_prefix="$dir/artifacts/$t-" \
        "$dir/corpus/$t" "fuzz/corpus/$t" >"$log" 2>&1; then
        execs=$(grep -Eo 'stat::number_of_executed_units: *[0-9]+|done, [0-9]+ inputs' "$log" | grep -Eo '[0-9]+' | tail -1 || true)
        printf '   %-12s ok   %4ss  %s inputs\n' "$t" "$(($(date +%s) - start))" "${execs:-replay}"
    else
        status=1
        printf '   %-12s FAILED (log: %s)\n' "$t" "$log"
        grep -E 'ERROR|runtime error|lmx fuzz|SUMMARY|Test unit written|input that failed' "$log" | head -20 || tail -40 "$log"
        ls "$dir/artifacts" | sed "s|^|   artifact: $dir/artifacts/|" | grep "/$t-" || true
    fi
done
exit $status
