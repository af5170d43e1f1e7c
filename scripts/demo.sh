#!/usr/bin/env bash
# The main job: builds polykv, fetches the model, starts polykvd on the CPU
# (shared-memory) pool and runs four agents — four polykv-worker processes
# with a real model (Qwen2.5-Coder-0.5B-Instruct by default), each a
# multi-turn agent script (one calls tools) — concurrently through the one
# daemon. Prints each agent's answers and a summary: tokens, tokens/s and pool
# bytes per agent; then stops polykvd with SIGTERM (it drains).
#
# Then the same support agent runs three times side by side under different
# QoS — uncompressed f16, K8V4 pages (keys int8, values int4), and the h2o
# policy at a 160-token budget set through the Admin API — and the demo prints
# each one's pool bytes and whether each answer matches the uncompressed one.
#
# Usage: scripts/demo.sh [--model NAME]   (NAME as scripts/fetch-model.sh
#        takes it: qwen2.5-coder-0.5b, qwen2.5-coder-1.5b, smollm2-135m)
# While it runs, metrics are at http://127.0.0.1:9464/metrics.
# Env: POLYKV_DEMO_DIR (run folder, default a fresh temp dir),
#      POLYKV_DEMO_SKIP_BUILD=1 to reuse an existing build/.
set -euo pipefail
cd "$(dirname "$0")/.."
model_name=qwen2.5-coder-0.5b
while [ $# -gt 0 ]; do
  case "$1" in
    --model) [ $# -ge 2 ] || { echo "demo: --model needs a NAME" >&2; exit 2; }; model_name=$2; shift 2 ;;
    -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "demo: unknown argument '$1' (--help)" >&2; exit 2 ;;
  esac
done
if [ "${POLYKV_DEMO_SKIP_BUILD:-0}" != 1 ]; then bash scripts/build.sh; fi
model=$(bash scripts/fetch-model.sh "$model_name")
bin=build/bin
dir=${POLYKV_DEMO_DIR:-$(mktemp -d /tmp/polykv-demo.XXXXXX)}
sock=$dir/polykvd.sock
log=$dir/polykvd.log

echo "== starting polykvd (socket $sock, metrics 127.0.0.1:9464, log $log)"
"$bin/polykvd" --socket "$sock" --pool-bytes 512MiB >"$log" 2>&1 &
daemon=$!
trap 'kill -TERM $daemon 2>/dev/null || true' EXIT
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
[ -S "$sock" ] || { cat "$log"; echo "polykvd did not start" >&2; exit 1; }
"$bin/polykvctl" --socket "$sock" qos set coder --priority high --max-bytes 128MiB >/dev/null

echo "== four agents, four worker processes, one daemon (model $model)"
start=$(date +%s.%N)
pids=()
for spec in "team-a coder tool_coder" "team-a researcher researcher" "team-b planner planner" \
            "team-b support support"; do
  set -- $spec
  "$bin/polykv-worker" run "tests/fixtures/worker/scripts/$3.jsonl" --model "$model" \
      --daemon "$sock" --tenant "$1" --agent "$2" --key-format f16 --value-format f16 \
      --threads 1 --summary >"$dir/$2.jsonl" 2>"$dir/$2.err" &
  pids+=($!)
done
# A look at the pool while the agents run: once all four sessions are open
# and have written a few turns.
for _ in $(seq 300); do
  n=$("$bin/polykvctl" --socket "$sock" sessions --json 2>/dev/null | grep -c '"session_id"' || true)
  [ "${n:-0}" -ge 4 ] && break
  sleep 0.1
done
sleep 3
"$bin/polykvctl" --socket "$sock" sessions || true
echo
"$bin/polykvctl" --socket "$sock" status || true
echo
echo "== metrics (polykv_ state families)"
curl -s 127.0.0.1:9464/metrics | grep -E '^polykv_(pool_bytes|pages|sessions|agent_bytes)' || true
fail=0
for p in "${pids[@]}"; do wait "$p" || fail=1; done
end=$(date +%s.%N)
echo
echo "== agent turns"
for a in coder researcher planner support; do
  grep -v '"summary":true' "$dir/$a.jsonl" | python3 -c '
import json, sys
for line in sys.stdin:
    t = json.loads(line)
    print("%-10s %-14s %4d prompt %3d generated  %s" % (t["agent"], t.get("id", ""),
          t["prompt_tokens"], t["completion_tokens"], t["text"][:110].replace("\n", " ")))'
done
echo
echo "== summary"
python3 - "$dir" "$start" "$end" <<'PY'
import json, sys
d, start, end = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
rows, total = [], 0
for a in ["coder", "researcher", "planner", "support"]:
    s = [json.loads(l) for l in open(f"{d}/{a}.jsonl") if '"summary":true' in l]
    if not s:
        print(f"{a}: no summary (see {d}/{a}.err)")
        continue
    s = s[-1]
    rows.append(s)
    total += s["prompt_tokens"] + s["completion_tokens"]
print("%-11s %6s %7s %10s %10s %12s  %s" % ("AGENT", "TURNS", "TOKENS", "PREFILL/S", "DECODE/S",
                                              "POOL BYTES", "CACHE"))
for s in rows:
    print("%-11s %6d %7d %10.1f %10.1f %12d  %s" % (s["agent"], s["turns"],
          s["prompt_tokens"] + s["completion_tokens"], s["prefill_tokens_per_s"],
          s["decode_tokens_per_s"], s["kv_bytes"], s["cache"]))
print(f"all agents: {total} tokens in {end - start:.1f} s wall = {total / (end - start):.1f} tokens/s")
PY

echo
echo "== one agent, three QoS settings, side by side (support script)"
"$bin/polykvctl" --socket "$sock" qos set support-h2o --policy h2o --budget-tokens 160 >/dev/null
qos_pids=()
for spec in "support-f16 f16 f16" "support-k8v4 int8 int4" "support-h2o f16 f16"; do
  set -- $spec
  "$bin/polykv-worker" run tests/fixtures/worker/scripts/support.jsonl --model "$model" \
      --daemon "$sock" --tenant team-c --agent "$1" --key-format "$2" --value-format "$3" \
      --threads 1 --summary >"$dir/$1.jsonl" 2>"$dir/$1.err" &
  qos_pids+=($!)
done
for p in "${qos_pids[@]}"; do wait "$p" || fail=1; done
python3 - "$dir" <<'PY'
import json, sys
d = sys.argv[1]
def load(a):
    turns, summary = [], None
    for line in open(f"{d}/{a}.jsonl"):
        t = json.loads(line)
        if t.get("summary"):
            summary = t
        else:
            turns.append(t)
    return turns, summary
base, base_s = load("support-f16")
# Pool bytes are the pages the session holds at the end, the worker's
# reserve-ahead (64 slots) included; tokens held are the cached slots.
print("%-13s %-15s %12s %8s %12s  %s" % ("AGENT", "QOS", "POOL BYTES", "OF F16", "TOKENS HELD",
                                          "ANSWERS = F16"))
for a, qos in [("support-f16", "f16, full"), ("support-k8v4", "K8V4, full"),
               ("support-h2o", "f16, h2o@160")]:
    turns, s = load(a)
    if s is None:
        print(f"{a}: no summary (see {d}/{a}.err)")
        continue
    same = sum(t["text"] == b["text"] for t, b in zip(turns, base))
    print("%-13s %-15s %12d %7.0f%% %12d  %d of %d" % (a, qos, s["kv_bytes"],
          100.0 * s["kv_bytes"] / max(1, base_s["kv_bytes"]), s.get("cached_tokens", 0), same,
          len(base)))
for a in ["support-k8v4", "support-h2o"]:
    turns, _ = load(a)
    for t, b in zip(turns, base):
        if t["text"] != b["text"]:
            # Where the two answers part (the first differing character).
            i = next((k for k, (x, y) in enumerate(zip(t["text"], b["text"])) if x != y),
                     min(len(t["text"]), len(b["text"])))
            lo = max(0, i - 40)
            print(f"  {a} {t.get('id', '')} differs from character {i}:")
            print(f"    {a:>12}: ...{t['text'][lo:i + 60]!r}")
            print(f"    {'support-f16':>12}: ...{b['text'][lo:i + 60]!r}")
PY
"$bin/polykvctl" --socket "$sock" status | head -n 4
kill -TERM $daemon
wait $daemon || true
trap - EXIT
echo "== polykvd log"
cat "$log"
if [ $fail -ne 0 ]; then
  echo "some agents failed; their stderr is in $dir/*.err" >&2
fi
exit $fail
