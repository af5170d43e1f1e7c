#!/usr/bin/env bash
# Installs polykv's build and test dependencies from Debian 12's packages.
# Idempotent: packages already present are left alone, and apt-get runs only
# when something is missing. Needs root (or sudo) for apt-get.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git curl unzip python3 python3-pip
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  prometheus-cpp-dev libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev
  libyaml-cpp-dev libspdlog-dev libopenblas-dev nlohmann-json3-dev
  clang  # scripts/check-thread-safety.sh (the thread_safety_test)
  prometheus  # promtool: the alerts' unit tests (prometheus_rules_test)
  strace  # systemd_syscalls_test: polykvd's system calls against the unit's filter
  openssl  # scripts/make-peer-certs.sh: the peer link's certificates (session_move_test)
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
