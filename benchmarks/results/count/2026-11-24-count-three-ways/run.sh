#!/bin/bash
# Count throughput at three commits, in rotating order, same machine, one run.
set -u
OUT=/work/main/docs/results/count/2026-11-24-count-three-ways
mkdir -p $OUT
ROUNDS=${ROUNDS:-3}
orders=("old mid new" "mid new old" "new old mid")
for r in $(seq 1 $ROUNDS); do
  for v in ${orders[$(((r - 1) % 3))]}; do
    cd /work/bench$v
    echo "=== round $r $v $(git log --format=%h -1) $(date -u +%FT%TZ)" | tee -a $OUT/run.log
    .venv/bin/kappaflow-bench --state-dir .kappaflow count --events 2000000 --measure throughput \
      --out $OUT/$v-round$r >> $OUT/run.log 2>&1
    echo "rc=$?" >> $OUT/run.log
    .venv/bin/kappaflow --state-dir .kappaflow down >> $OUT/run.log 2>&1
  done
done
echo "=== done $(date -u +%FT%TZ)" >> $OUT/run.log
