#!/bin/bash
# Count throughput, before and after the count rewrite, alternating, same machine, one run.
set -u
OUT=/work/main/docs/results/count/2026-11-24-count-on-api
mkdir -p $OUT
ROUNDS=${ROUNDS:-3}
for r in $(seq 1 $ROUNDS); do
  if [ $((r % 2)) -eq 1 ]; then order="old new"; else order="new old"; fi
  for v in $order; do
    cd /work/bench$v
    echo "=== round $r $v $(date -u +%FT%TZ)" | tee -a $OUT/run.log
    .venv/bin/kappaflow-bench --state-dir .kappaflow count --events 1000000 --measure throughput \
      --out $OUT/$v-round$r >> $OUT/run.log 2>&1
    echo "rc=$?" >> $OUT/run.log
    .venv/bin/kappaflow --state-dir .kappaflow down >> $OUT/run.log 2>&1
  done
done
echo "=== done $(date -u +%FT%TZ)" >> $OUT/run.log
