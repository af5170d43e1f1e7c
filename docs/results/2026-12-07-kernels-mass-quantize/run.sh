#!/bin/bash
# before/after, alternating, quantize and prefill, 1 and 2 threads
cd /tmp/qb
for th in 1 2; do
  for r in 1 2; do
    for b in before after; do
      /tmp/bench-$b kernels --only quantize --threads $th --json > quantize-$b-t$th-r$r.json 2>/dev/null
      /tmp/bench-$b kernels --only prefill --threads $th --json > prefill-$b-t$th-r$r.json 2>/dev/null
      /tmp/bench-$b kernels --only decode --threads $th --json > decode-$b-t$th-r$r.json 2>/dev/null
    done
  done
done
echo done > /tmp/qb/DONE
