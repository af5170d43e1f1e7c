#!/usr/bin/env bash
# The main job: builds polykv, fetches the model, then shows what polykv is
# for — more agents in the same memory, answers kept (scripts/demo.py):
#
# polykvd starts with a pool in which only a few of the agents' uncompressed
# (f16) caches fit; several times as many agents (polykv-worker processes,
# Qwen2.5-Coder-0.5B-Instruct by default, ~2,000-token agent tasks, two
# tenants) run in it at once under the daemon's built-in default QoS. Beside
# them a second polykvd runs the same agents with an exact f16 cache. The demo
# shows `polykvctl sessions`, `polykvctl status` and the metrics mid-run, then
# one line per agent (its peak bytes against its f16 peak, its answer against
# the f16 one) and how many agents the pool admits each way.
#
# Usage: scripts/demo.sh [--model NAME] [--metrics-port PORT|off]
#                        [--pool-mib N] [--per-family N] [--dir DIR]
#   NAME as scripts/fetch-model.sh takes it (qwen2.5-coder-0.5b, ...);
#   metrics on 127.0.0.1:9464 unless --metrics-port says otherwise.
# Env: POLYKV_DEMO_SKIP_BUILD=1 to reuse an existing build/.
set -euo pipefail
cd "$(dirname "$0")/.."
model_name=qwen2.5-coder-0.5b
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --model) [ $# -ge 2 ] || { echo "demo: --model needs a NAME" >&2; exit 2; }; model_name=$2; shift 2 ;;
    --metrics-port|--pool-mib|--per-family|--dir)
      [ $# -ge 2 ] || { echo "demo: $1 needs a value" >&2; exit 2; }; args+=("$1" "$2"); shift 2 ;;
    -h|--help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "demo: unknown argument '$1' (--help)" >&2; exit 2 ;;
  esac
done
if [ "${POLYKV_DEMO_SKIP_BUILD:-0}" != 1 ]; then bash scripts/build.sh; fi
model=$(bash scripts/fetch-model.sh "$model_name")
exec python3 scripts/demo.py --model "$model" --bin-dir build/bin "${args[@]}"
