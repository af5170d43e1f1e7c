#!/usr/bin/env bash
# The test suite: installs what it needs, builds, fetches every input a test
# reads (the models, the evaluation data), runs every test except the long
# soak/fuzz ones (ctest label 'soak'; run those with
# `ctest --test-dir build -L soak`).
#
# CI is set for the run (unless already set): every input is fetched here, so
# a test that finds one missing fails, naming the command that fetches it,
# instead of skipping (tests/missing_input.h).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
# SmolLM2 for the fast unit tests; both Qwen2.5-Coder files for the tests of
# the qwen2 architecture, its tensor types and its tokenizer.
for model in smollm2-135m qwen2.5-coder-0.5b qwen2.5-coder-1.5b; do
  bash scripts/fetch-model.sh "$model" >/dev/null
done
# The bfcl and humaneval data the workload generator's tests read.
python3 bench/eval/data.py >/dev/null
# The Python package, built and installed into its venv (torch, transformers):
# the tests labelled `python` run it.
bash scripts/setup-python-venv.sh >/dev/null
export CI=${CI:-1}
ctest --test-dir build -LE soak -j"$(nproc)" --output-on-failure --timeout 900
