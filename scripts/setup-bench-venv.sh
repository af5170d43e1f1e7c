#!/usr/bin/env bash
# Creates the bench-only virtual environment that holds the llama.cpp anchor of
# `polykv-bench worker`: PyPI's llama-cpp-python, pinned, built from its sdist
# (which vendors llama.cpp). Never a runtime dependency of polykv: only
# bench/anchor/llamacpp_bench.py imports it.
#
# Build: llama.cpp's CPU backend for this machine's CPU (GGML_NATIVE=ON, i.e.
# -march=native) less AMX (-mno-amx-tile -mno-amx-int8 -mno-amx-bf16: the VMs
# we run on advertise AMX in cpuid but trap its tile instructions, SIGILL),
# OpenMP threads (llama.cpp's default), no BLAS, no GPU backend, no multimodal
# (mtmd) library. Takes ~10-20 minutes on 2 cores; runs under `nice`.
# Idempotent: a venv whose llama_cpp imports at the pinned version, built with
# these flags (the stamp file .polykv-build in the venv), is left alone
# (FORCE=1 rebuilds it).
#
# Usage: scripts/setup-bench-venv.sh [VENV]
#   VENV defaults to ${POLYKV_BENCH_VENV:-$HOME/.cache/polykv/bench-venv}.
#   JOBS (default: nproc) sets the build's parallelism.
# Prints the venv's python on stdout (progress on stderr); exit 0 on success.
set -euo pipefail

readonly kVersion=0.3.36  # llama-cpp-python; vendors llama.cpp (see the JSON's llama_cpp_version)
readonly kNoAmx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
readonly kCmakeArgs="-DCMAKE_C_FLAGS='$kNoAmx' -DCMAKE_CXX_FLAGS='$kNoAmx' -DGGML_NATIVE=ON -DGGML_CUDA=OFF -DGGML_BLAS=OFF -DGGML_OPENMP=ON -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DCMAKE_BUILD_TYPE=Release"

die() { echo "setup-bench-venv: error: $*" >&2; exit 1; }
log() { echo "setup-bench-venv: $*" >&2; }

case "${1:-}" in -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
venv=${1:-${POLYKV_BENCH_VENV:-$HOME/.cache/polykv/bench-venv}}
py="$venv/bin/python"
stamp="$venv/.polykv-build"

installed_version() {
  [[ -x "$py" ]] || return 1
  "$py" -c 'import llama_cpp, sys; sys.stdout.write(llama_cpp.__version__)' 2>/dev/null
}

if [[ "${FORCE:-0}" != 1 ]] && [[ "$(installed_version || true)" == "$kVersion" ]] &&
   [[ "$(cat "$stamp" 2>/dev/null)" == "$kVersion $kCmakeArgs" ]]; then
  log "present: llama-cpp-python $kVersion in $venv"
  echo "$py"
  exit 0
fi

command -v python3 >/dev/null || die "python3 is not installed (Debian: apt-get install python3 python3-venv)"
for tool in cmake gcc g++; do
  command -v "$tool" >/dev/null || die "'$tool' is not installed (scripts/install-deps.sh installs it)"
done

if [[ ! -x "$py" ]]; then
  log "creating venv $venv"
  mkdir -p "$(dirname "$venv")" || die "cannot create $(dirname "$venv")"
  python3 -m venv "$venv" >&2 || die "python3 -m venv failed (Debian: apt-get install python3-venv)"
fi
"$py" -m pip --version >/dev/null 2>&1 || die "the venv $venv has no pip; remove it and rerun"

jobs=${JOBS:-$(nproc)}
log "building llama-cpp-python==$kVersion from source (jobs=$jobs, CMAKE_ARGS=$kCmakeArgs); ~10+ minutes"
start=$(date +%s)
# --no-binary: build llama.cpp here, for this CPU, never a prebuilt wheel;
# --force-reinstall --no-deps rebuilds it when the flags changed, then the
# second install brings its Python dependencies.
# pip's stdout is the build log: it goes to stderr, like all progress.
CMAKE_ARGS="$kCmakeArgs" CMAKE_BUILD_PARALLEL_LEVEL="$jobs" \
  nice -n 10 "$py" -m pip install --disable-pip-version-check -v \
  --no-binary llama-cpp-python --no-cache-dir --force-reinstall --no-deps \
  "llama-cpp-python==$kVersion" >&2 &&
  "$py" -m pip install --disable-pip-version-check "llama-cpp-python==$kVersion" >&2 ||
  die "pip install llama-cpp-python==$kVersion failed (see the log above: a compiler error, or PyPI unreachable?)"

got=$(installed_version) || die "llama_cpp does not import from $py after the install"
[[ "$got" == "$kVersion" ]] || die "installed llama_cpp is $got, expected $kVersion"
echo "$kVersion $kCmakeArgs" > "$stamp"
log "built llama-cpp-python $got in $(( $(date +%s) - start )) s"
echo "$py"
