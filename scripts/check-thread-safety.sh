#!/usr/bin/env bash
# Clang's thread-safety analysis over the rooms that annotate their locks
# (ABSL_GUARDED_BY, ABSL_EXCLUSIVE_LOCKS_REQUIRED, ...): daemon/, kernels/ and
# libpolykv_client (client/lib, client/ctl). GCC ignores the annotations, so this
# is their only check. (policies/ has no threads; the reference worker no
# annotations, and its 30 units would triple the time.)
# Re-runs each C++ translation unit of those rooms from the GCC build's
# compile_commands.json with clang++ -fsyntax-only -Wthread-safety
# -Werror=thread-safety: same flags and include trees, no objects, no link.
# Usage: scripts/check-thread-safety.sh [build-dir]   (exit 77: no clang++)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
clang=${CLANGXX:-$(command -v clang++ || true)}
if [ -z "$clang" ]; then
  echo "thread-safety: no clang++ (apt-get install clang, or set CLANGXX); skipped"
  exit 77
fi
if [ ! -f "$build/compile_commands.json" ]; then
  echo "thread-safety: $build/compile_commands.json missing (configure $build first)"
  exit 2
fi
exec python3 - "$build/compile_commands.json" "$PWD" "$clang" <<'PY'
import concurrent.futures, json, os, shlex, subprocess, sys
db, root, clang = sys.argv[1], sys.argv[2], sys.argv[3]
rooms = tuple(f"{root}/{r}/" for r in ("daemon", "kernels", "client/lib", "client/ctl"))
jobs = []
for e in json.load(open(db)):
    f = e["file"]
    if not f.startswith(rooms) or not f.endswith(".cc"):
        continue
    args = e["arguments"] if "arguments" in e else shlex.split(e["command"])
    cmd, skip = [clang], False
    for a in args[1:]:
        if skip:
            skip = False
        elif a in ("-o", "-MF", "-MT", "-MQ"):
            skip = True
        elif a not in ("-c", "-MD", "-MMD"):
            cmd.append(a)
    # Only thread-safety diagnostics are errors; other clang warnings are silenced.
    cmd += ["-fsyntax-only", "-Wno-everything", "-Wthread-safety", "-Werror=thread-safety"]
    jobs.append((os.path.relpath(f, root), e["directory"], cmd))
version = subprocess.run([clang, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
print(f"thread-safety: {len(jobs)} translation units, {version}", flush=True)

def run(job):
    name, cwd, cmd = job
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    return name, p.returncode, p.stderr

failed = 0
with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 2) as pool:
    for name, rc, err in pool.map(run, jobs):
        if rc != 0:
            failed += 1
            print(f"thread-safety: {name}\n{err}", flush=True)
print(f"thread-safety: {'FAILED in %d units' % failed if failed else 'ok'}")
sys.exit(1 if failed else 0)
PY
