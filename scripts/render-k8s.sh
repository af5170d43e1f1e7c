#!/usr/bin/env bash
# Renders deploy/k8s/{configmap,daemonset,service,servicemonitor}.yaml from the
# Helm chart (deploy/helm/polykvd) with its default values, in namespace
# polykv, ServiceMonitor on: the plain manifests are the chart's output, so
# the two cannot drift (ctest helm_chart_test compares them).
# deploy/k8s/namespace.yaml is not the chart's (charts do not own namespaces).
# Usage: scripts/render-k8s.sh [--check]   (--check: exit 1 if a file differs)
set -euo pipefail
cd "$(dirname "$0")/.."
helm=$(bash scripts/fetch-helm.sh)
check=false
[[ "${1:-}" == "--check" ]] && check=true
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# (helm warns on stderr that files/polykvd.yaml is a link: shown only on failure.)
if ! "$helm" template polykvd deploy/helm/polykvd --namespace polykv \
    --set serviceMonitor.enabled=true > "$out/all.yaml" 2> "$out/err"; then
  cat "$out/err" >&2
  exit 1
fi
python3 - "$out" <<'PY'
import re, sys
out = sys.argv[1]
text = open(f"{out}/all.yaml").read()
for part in re.split(r"^---\n", text, flags=re.M):
    m = re.match(r"# Source: polykvd/templates/(\S+\.yaml)\n", part)
    if not m:
        continue
    body = part[m.end():]
    header = ("# Rendered from deploy/helm/polykvd by scripts/render-k8s.sh: edit the chart,\n"
              "# then run the script.\n")
    open(f"{out}/{m.group(1)}", "w").write(header + body)
PY
status=0
for f in configmap daemonset service servicemonitor; do
  if $check; then
    cmp -s "$out/$f.yaml" "deploy/k8s/$f.yaml" || { echo "deploy/k8s/$f.yaml differs from the chart's rendering" >&2; status=1; }
  else
    cp "$out/$f.yaml" "deploy/k8s/$f.yaml"
  fi
done
exit $status
