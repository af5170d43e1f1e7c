#!/usr/bin/env bash
# The libFuzzer runs of tests/fuzz/ (issue 14): configures build-fuzz/ with
# clang, libFuzzer, ASan and UBSan (POLYKV_FUZZ=ON, cmake/fuzz.cmake),
# builds only the fuzz targets and what they link, then runs each target
# over its seed corpus for RUNS executions and prints what libFuzzer
# reported: executions, exec/s, crashes, coverage, corpus (units/bytes),
# peak RSS.
#
#   scripts/fuzz.sh [target...]            default: all four targets
#   RUNS=1000000    executions per target (libFuzzer -runs)
#   MAX_TIME=0      seconds per target, 0 = no limit (libFuzzer -max_total_time);
#                   the run stops at whichever of RUNS and MAX_TIME comes first
#   JOBS=2          build parallelism     CLANG=clang-14 (clang++ is $CLANG's twin)
# The libFuzzer options are the ctest soak test's (tests/fuzz/CMakeLists.txt).
#   REPORT_ONLY=1   only summarize the logs of an earlier run
#
# Logs: build-fuzz/fuzz-logs/<target>.log (libFuzzer's own output; its last
# lines are the stat:: figures). New inputs: build-fuzz/fuzz-corpus/<target>/.
# A crash: build-fuzz/fuzz-corpus/<target>-crash-<sha1>; replay it with
#   build-fuzz/tests/<target> <file>   (or the GCC build's build/tests/<target> <file>).
# Exit status: 1 when any target crashed.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${RUNS:-1000000}
max_time=${MAX_TIME:-0}
jobs=${JOBS:-2}
clang=${CLANG:-clang-14}
clangxx=${clang/clang/clang++}
all=(request_fuzzer fd_wire_fuzzer fd_broker_fuzzer grpc_fuzzer)
targets=("${@:-${all[@]}}")
build=build-fuzz
logs=$build/fuzz-logs

if [ -z "${REPORT_ONLY:-}" ]; then
  launcher=()
  if command -v ccache >/dev/null; then
    launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  fi
  cmake -S . -B $build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPOLYKV_CUDA=OFF \
    -DPOLYKV_FUZZ=ON -DCMAKE_C_COMPILER="$clang" -DCMAKE_CXX_COMPILER="$clangxx" \
    "${launcher[@]}" >/dev/null
  cmake --build $build -j"$jobs" --target "${targets[@]}"
  mkdir -p $logs
  for t in "${targets[@]}"; do
    # The ctest soak command (options in tests/fuzz/CMakeLists.txt); libFuzzer
    # takes the last of repeated flags, so -runs and -max_total_time win.
    cmd=$(ctest --test-dir $build -R "^${t}_soak\$" --show-only=json-v1 |
      python3 -c 'import json, shlex, sys; print(shlex.join(json.load(sys.stdin)["tests"][0]["command"]))')
    echo "fuzz.sh: $t: $runs runs (max ${max_time}s), log $logs/$t.log"
    eval "$cmd -runs=$runs -max_total_time=$max_time" >$logs/$t.log 2>&1 || true
  done
fi

# libFuzzer ends with "stat::name: value" lines (-print_final_stats=1) after
# a last status line "#N DONE cov: C ft: F corp: U/Sb ..."; a crash prints
# "==NNN==ERROR" or "FUZZ FINDING" and "Test unit written to <file>".
crashed=0
printf '%-17s %11s %7s %7s %6s %13s %6s %s\n' target executions exec/s crashes cov corpus rss_mb status
for t in "${targets[@]}"; do
  log=$logs/$t.log
  [ -f "$log" ] || { printf '%-17s (no log)\n' "$t"; continue; }
  stat() { sed -n "s/^stat::$1: *//p" "$log" | tail -1; }
  last() { grep -o " $1: [^ ]*" "$log" | tail -1 | cut -d' ' -f3; }
  crashes=$(grep -c 'Test unit written to' "$log" || true)
  status=ok
  if [ "$crashes" -gt 0 ]; then
    status="CRASH $(grep -o 'Test unit written to .*' "$log" | head -1 | cut -d' ' -f5)"
    crashed=1
  elif [ -z "$(stat number_of_executed_units)" ]; then
    status="running or stopped: last $(grep -o '^#[0-9]*' "$log" | tail -1) execs"
  fi
  printf '%-17s %11s %7s %7s %6s %13s %6s %s\n' "$t" "$(stat number_of_executed_units)" \
    "$(stat average_exec_per_sec)" "$crashes" "$(last cov)" "$(last corp)" \
    "$(stat peak_rss_mb)" "$status"
done
exit $crashed
