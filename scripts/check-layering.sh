#!/usr/bin/env bash
# Fails when a source file includes a room it may not depend on
# (docs/architecture.md, "Dependency direction"):
#   kernels  -> nothing of ours
#   policies -> kernels
#   client   -> kernels, proto, policies
#   daemon   -> policies, kernels, proto
# and nothing outside tests/ includes daemon/.
set -u
root=${1:-$(git rev-parse --show-toplevel)}
cd "$root" || exit 2
bad=0
check() {  # check ROOM ALLOWED_REGEX
  local room=$1 allowed=$2
  while IFS= read -r hit; do
    file=${hit%%:*}; path=$(sed -E 's/.*#include "([^"]+)".*/\1/' <<<"$hit")
    case "$path" in
      polykv/v1/*) inc=proto ;;   # generated protobuf/gRPC headers
      polykv/*) inc=client ;;     # libpolykv_client's public headers
      kernels/*|policies/*|proto/*|daemon/*|client/*|bench/*|tests/*) inc=${path%%/*} ;;
      *) continue ;;              # third-party (absl/, prometheus/, ...)
    esac
    if ! grep -qE "^($allowed)$" <<<"$inc"; then
      echo "layering: $file includes $inc/ (allowed from $room/: $allowed)"; bad=1
    fi
  done < <(grep -rnE '^#include "[a-z_0-9]+/' "$room" --include='*.h' --include='*.cc' --include='*.cu' --include='*.cuh' 2>/dev/null)
}
check kernels  'kernels'
check policies 'policies|kernels'
check client   'client|kernels|proto|policies'
check daemon   'daemon|policies|kernels|proto'
check proto    'proto'
check bench    'bench|client|kernels|policies|proto|daemon'
if [ $bad -ne 0 ]; then exit 1; fi
echo "layering: ok"
