#!/usr/bin/env bash
# The main job: builds polykv, starts polykvd on the CPU (shared-memory) pool
# and runs a demo workload of agents through it, then prints what the daemon
# saw and stops it cleanly (SIGTERM drains).
#
# While it runs, metrics are at http://127.0.0.1:9464/metrics.
# Env: POLYKV_DEMO_DIR (socket folder, default a fresh temp dir),
#      POLYKV_DEMO_SKIP_BUILD=1 to reuse an existing build/.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${POLYKV_DEMO_SKIP_BUILD:-0}" != 1 ]; then bash scripts/build.sh; fi
bin=build/bin
dir=${POLYKV_DEMO_DIR:-$(mktemp -d /tmp/polykv-demo.XXXXXX)}
sock=$dir/polykvd.sock
log=$dir/polykvd.log

echo "== starting polykvd (socket $sock, metrics 127.0.0.1:9464, log $log)"
"$bin/polykvd" --socket "$sock" --pool-bytes 512MiB --lease-ms 3000 >"$log" 2>&1 &
daemon=$!
trap 'kill -TERM $daemon 2>/dev/null || true' EXIT
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
[ -S "$sock" ] || { cat "$log"; echo "polykvd did not start" >&2; exit 1; }

"$bin/polykvctl" --socket "$sock" qos set reviewer --priority high --max-bytes 64MiB >/dev/null

echo "== four agents in two tenants reserve, write and verify their KV pages"
pids=()
i=0
for spec in "team-a coder 2048" "team-a reviewer 1024" "team-b planner 1536" "team-b tester 768"; do
  set -- $spec
  i=$((i + 1))
  "$bin/polykv-test-worker" run --socket "$sock" --tenant "$1" --agent "$2" --tokens "$3" \
      --seed "$i" --hold-ms 2000 >"$dir/agent-$2.json" &
  pids+=($!)
done
sleep 1
"$bin/polykvctl" --socket "$sock" sessions
echo
"$bin/polykvctl" --socket "$sock" status
echo
echo "== metrics (polykv_ families, first lines)"
curl -s 127.0.0.1:9464/metrics | grep -E '^polykv_(pool_bytes|pages|sessions|agent_bytes|rpc_total)' | head -n 24 || true
fail=0
for p in "${pids[@]}"; do wait "$p" || fail=1; done
echo
echo "== agent results"
cat "$dir"/agent-*.json
echo
"$bin/polykvctl" --socket "$sock" status
kill -TERM $daemon
wait $daemon
trap - EXIT
echo "== polykvd log"
cat "$log"
exit $fail
