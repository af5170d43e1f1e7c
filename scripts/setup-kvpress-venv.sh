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

die() { echo "setup-kvpress-venv: error: $*" >&2; exit 1; }
log() { echo "setup-kvpress-venv: $*" >&2; }

case "${1:-}" in -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
root=$(cd "$(dirname "$0")/.." && pwd)
req="$root/bench/anchor/kvpress-requirements.txt"
venv=${1:-${POLYKV_KVPRESS_VENV:-$HOME/.cache/polykv/kvpress-venv}}
py="$venv/bin/python"
stamp="$venv/.polykv-requirements.sha256"
want=$(sha256sum "$req" | cut -d' ' -f1)

if [[ "${FORCE:-0}" != 1 && -x "$py" && "$(cat "$stamp" 2>/dev/null)" == "$want" ]]; then
  log "$venv is up to date"
  echo "$py"
  exit 0
fi
if [[ ! -x "$py" ]]; then
  log "creating $venv"
  python3 -m venv "$venv" || die "python3 -m venv failed (Debian: apt-get install python3-venv)"
fi
log "pip install -r ${req#"$root"/} into $venv (a few minutes)"
"$py" -m pip install --disable-pip-version-check --progress-bar off -r "$req" >&2 ||
  die "pip install failed (is PyPI reachable?)"
"$py" -c 'import kvpress, torch, transformers, gguf' || die "the venv does not import kvpress"
echo "$want" > "$stamp"
echo "$py"
