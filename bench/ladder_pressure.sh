#!/usr/bin/env bash
# The pressure ladder on the product path: N polykv-worker processes (one
# agent script each, concurrently) on one live polykvd whose pool is too
# small for all of them, each agent's QoS set through polykvctl. Three runs:
#   reference  a pool large enough (no pressure): the answers to match;
#   requant    the small pool, ladder step 1 allowed (values to int4 first);
#   evict      the same pool, agents' value floor at f16 (step 1 off: the
#              ladder goes straight to compaction).
# Prints, per run, the ladder's steps and evicted tokens (daemon metrics),
# each agent's peak pool bytes and how many answers match the reference.
#
# Usage: bench/ladder_pressure.sh [--agents N] [--pool-mib M] [--policy P]
#        [--model NAME] [--script NAME] [--bin DIR]
# (defaults: 4 agents, 16 MiB, h2o, smollm2-135m, support, build/bin).
set -euo pipefail
cd "$(dirname "$0")/.."
agents=4 pool_mib=16 policy=h2o model_name=smollm2-135m script=support bin=build/bin
while [ $# -gt 0 ]; do
  case "$1" in
    --agents) agents=$2; shift 2 ;;
    --pool-mib) pool_mib=$2; shift 2 ;;
    --policy) policy=$2; shift 2 ;;
    --model) model_name=$2; shift 2 ;;
    --script) script=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "ladder_pressure: unknown argument '$1' (--help)" >&2; exit 2 ;;
  esac
done
model=$(bash scripts/fetch-model.sh "$model_name")
dir=$(mktemp -d /tmp/polykv-ladder.XXXXXX)
port=$((20000 + RANDOM % 20000))
echo "run folder $dir" >&2

run() {  # label pool_bytes value_floor
  local label=$1 pool=$2 floor=$3 sock=$dir/$1.sock
  "$bin/polykvd" --socket "$sock" --pool-bytes "$pool" --low-watermark-bytes $((pool / 4)) \
      --metrics-address "127.0.0.1:$port" >"$dir/$label.polykvd.log" 2>&1 &
  local daemon=$!
  for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
  local pids=()
  for i in $(seq "$agents"); do
    local args=(qos set "a$i" --policy "$policy" --priority "$([ "$i" -le 2 ] && echo low || echo normal)")
    [ -n "$floor" ] && args+=(--value-floor "$floor")
    "$bin/polykvctl" --socket "$sock" "${args[@]}" >/dev/null
  done
  for i in $(seq "$agents"); do
    "$bin/polykv-worker" run "tests/fixtures/worker/scripts/$script.jsonl" --model "$model" \
        --daemon "$sock" --tenant t --agent "a$i" --key-format f16 --value-format f16 \
        --threads 1 --summary >"$dir/$label.a$i.jsonl" 2>"$dir/$label.a$i.err" &
    pids+=($!)
  done
  local fail=0
  for p in "${pids[@]}"; do wait "$p" || fail=1; done
  curl -s "127.0.0.1:$port/metrics" >"$dir/$label.metrics" || true
  kill -TERM "$daemon"; wait "$daemon" || true
  [ "$fail" = 0 ] || echo "$label: a worker failed (see $dir/$label.a*.err)" >&2
}

run reference $((512 << 20)) ""
run requant $((pool_mib << 20)) ""
run evict $((pool_mib << 20)) f16
python3 - "$dir" "$agents" "$policy" "$pool_mib" <<'PY'
import json, re, sys
d, n, policy, pool = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def turns(label, i):
    out, summary = [], None
    try:
        for line in open(f"{d}/{label}.a{i}.jsonl"):
            t = json.loads(line)
            if t.get("summary"):
                summary = t
            else:
                out.append(t["text"])
    except (OSError, json.JSONDecodeError):
        pass
    return out, summary
def metric(label, name, **labels):
    total = 0.0
    try:
        text = open(f"{d}/{label}.metrics").read()
    except OSError:
        return 0
    for m in re.finditer(r"^%s\{([^}]*)\} (\S+)$" % name, text, re.M):
        if all(f'{k}="{v}"' in m.group(1) for k, v in labels.items()):
            total += float(m.group(2))
    return int(total)
ref = [turns("reference", i)[0] for i in range(1, n + 1)]
result = {"agents": n, "policy": policy, "pool_mib": int(pool), "runs": {}}
for label in ["reference", "requant", "evict"]:
    same = total = 0
    peaks = []
    for i in range(1, n + 1):
        t, s = turns(label, i)
        same += sum(a == b for a, b in zip(t, ref[i - 1]))
        total += len(ref[i - 1])
        peaks.append(s["kv_bytes_peak"] if s else None)
    result["runs"][label] = {
        "answers_matching_reference": same, "answers": total, "peak_bytes_per_agent": peaks,
        "ladder_requant": metric(label, "polykv_ladder_steps_total", step="requant"),
        "ladder_compact": metric(label, "polykv_ladder_steps_total", step="compact"),
        "ladder_refuse": metric(label, "polykv_ladder_steps_total", step="refuse"),
        "evicted_tokens": metric(label, "polykv_evicted_tokens_total"),
    }
print(json.dumps(result, indent=1))
PY
