#!/usr/bin/env bash
# Creates the venv of the Python package's tests and benchmarks (pins in
# client/python/requirements-test.txt: torch, transformers, gguf, pytest and
# the package's build requirements), then builds and installs the package
# from this checkout into it (pip install ./client/python, the build kept in
# build/python so a rebuild is incremental). ~4 GB from PyPI the first time.
#
# Usage: scripts/setup-python-venv.sh [VENV]
#   VENV defaults to ${POLYKV_PYTHON_VENV:-$HOME/.cache/polykv/python-venv}.
# Prints the venv's python on stdout (progress on stderr); exit 0 on success.
set -euo pipefail

case "${1:-}" in -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/scripts/lib/pinned-venv.sh"
venv=${1:-${POLYKV_PYTHON_VENV:-$HOME/.cache/polykv/python-venv}}
pinned_venv setup-python-venv "$venv" "$root/client/python/requirements-test.txt" \
  "torch, transformers, gguf, pytest, nanobind"
echo "setup-python-venv: building and installing the polykv package (build/python)" >&2
"$venv/bin/python" -m pip install --disable-pip-version-check --progress-bar off \
  --no-build-isolation --no-deps -C build-dir="$root/build/python" "$root/client/python" >&2 ||
  { echo "setup-python-venv: error: pip install ./client/python failed" >&2; exit 1; }
echo "$venv/bin/python"
