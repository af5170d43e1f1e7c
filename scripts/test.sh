#!/usr/bin/env bash
# The test suite: installs what it needs, builds, fetches the model, runs every
# test except the long soak/fuzz ones (ctest label 'soak'; run those with
# `ctest --test-dir build -L soak`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
if [ -f scripts/fetch-model.sh ]; then
  bash scripts/fetch-model.sh
fi
ctest --test-dir build -LE soak -j"$(nproc)" --output-on-failure --timeout 900
