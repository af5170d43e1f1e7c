# pinned_venv NAME VENV REQUIREMENTS IMPORTS: makes VENV a venv with
# REQUIREMENTS installed (pip, PyPI) and checks that `import IMPORTS` works.
# Idempotent: a venv whose stamp matches the requirements file is left alone
# (FORCE=1 reinstalls). Progress on stderr, prefixed with NAME. Sourced by the
# setup-*-venv.sh scripts.
pinned_venv() {
  local name=$1 venv=$2 req=$3 imports=$4
  local py="$venv/bin/python" stamp="$venv/.polykv-requirements.sha256"
  local want
  want=$(sha256sum "$req" | cut -d' ' -f1)
  if [[ "${FORCE:-0}" != 1 && -x "$py" && "$(cat "$stamp" 2>/dev/null)" == "$want" ]]; then
    echo "$name: $venv is up to date" >&2
    return 0
  fi
  if [[ ! -x "$py" ]]; then
    echo "$name: creating $venv" >&2
    mkdir -p "$(dirname "$venv")"
    if ! python3 -m venv "$venv"; then
      echo "$name: error: python3 -m venv failed (Debian: apt-get install python3-venv)" >&2
      return 1
    fi
  fi
  echo "$name: pip install -r $req into $venv (a few minutes the first time)" >&2
  "$py" -m pip install --disable-pip-version-check --progress-bar off -r "$req" >&2 ||
    { echo "$name: error: pip install failed (is PyPI reachable?)" >&2; return 1; }
  "$py" -c "import $imports" ||
    { echo "$name: error: the venv does not import $imports" >&2; return 1; }
  echo "$want" > "$stamp"
}
