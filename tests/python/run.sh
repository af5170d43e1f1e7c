#!/usr/bin/env bash
# Runs pytest on the given files in the Python package's venv
# (${POLYKV_PYTHON_VENV:-$HOME/.cache/polykv/python-venv}). A missing venv
# fails under CI and skips (77) otherwise, naming the command that makes it.
set -euo pipefail
py=${POLYKV_PYTHON_VENV:-$HOME/.cache/polykv/python-venv}/bin/python
if [[ ! -x "$py" ]] || ! "$py" -c "import polykv, pytest" 2>/dev/null; then
  msg="missing test input: the polykv package in $py (make it: scripts/setup-python-venv.sh)"
  if [[ "${CI:-}" != "" && "${CI:-}" != 0 && "${CI:-}" != false ]]; then
    echo "$msg (CI is set: a missing input fails)" >&2
    exit 1
  fi
  echo "$msg" >&2
  exit 77
fi
exec "$py" -m pytest -v -p no:cacheprovider "$@"
