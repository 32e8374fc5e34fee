#!/bin/bash
cd /work/wt-perf
. /tmp/kf-perf/env.sh
B=".venv/bin/kappaflow-bench --state-dir /tmp/kf-perf/state"
OUT=.
mkdir -p $OUT
for e in kappaflow flink; do
  echo "== $e $(date -u +%FT%TZ) $(uptime)"
  $B ysb --engine $e --rate 50000 --duration 60 --partitions 2 --out $OUT/$e > $OUT/$e.console.log 2>&1
  echo "rc $? $(date -u +%FT%TZ) $(uptime)"
done
