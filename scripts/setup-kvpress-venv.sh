#!/usr/bin/env bash
# Creates the venv of the kvpress anchor (bench/anchor/kvpress_eval.py):
# NVIDIA kvpress, CPU torch, transformers and gguf, pinned in
# bench/anchor/kvpress-requirements.txt. Bench-only: nothing in polykv needs it.
# Downloads ~4 GB from PyPI (torch's wheel depends on the CUDA libraries).
# Idempotent: a venv whose stamp matches the requirements file is left alone
# (FORCE=1 reinstalls).
#
# Usage: scripts/setup-kvpress-venv.sh [VENV]
#   VENV defaults to ${POLYKV_KVPRESS_VENV:-$HOME/.cache/polykv/kvpress-venv}.
# Prints the venv's python on stdout (progress on stderr); exit 0 on success.
set -euo pipefail

case "${1:-}" in -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/scripts/lib/pinned-venv.sh"
venv=${1:-${POLYKV_KVPRESS_VENV:-$HOME/.cache/polykv/kvpress-venv}}
pinned_venv setup-kvpress-venv "$venv" "$root/bench/anchor/kvpress-requirements.txt" \
  "kvpress, torch, transformers, gguf"
echo "$venv/bin/python"
