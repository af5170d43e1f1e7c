#!/usr/bin/env bash
# The test suite: installs what it needs, builds, fetches the model, runs every
# test except the long soak/fuzz ones (ctest label 'soak'; run those with
# `ctest --test-dir build -L soak`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
# SmolLM2 for the fast unit tests; both Qwen2.5-Coder files for the tests of
# the qwen2 architecture, its tensor types and its tokenizer.
for model in smollm2-135m qwen2.5-coder-0.5b qwen2.5-coder-1.5b; do
  bash scripts/fetch-model.sh "$model" >/dev/null
done
ctest --test-dir build -LE soak -j"$(nproc)" --output-on-failure --timeout 900
