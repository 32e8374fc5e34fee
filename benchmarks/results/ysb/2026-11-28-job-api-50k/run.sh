#!/bin/bash
# YSB at 50,000 events/s: the job API's job (table join), Flink, the job API's job (map join), back to back.
. /tmp/kfb-env.sh
cd /work/wt-bench
OUT=${OUT:-/tmp/kfb/ysb-50k}
mkdir -p $OUT
for run in "spark-table:--engine spark" "flink:--engine flink" "spark-map:--engine spark --join map"; do
  name=${run%%:*}; args=${run#*:}
  echo "== $name $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)"
  timeout 1500 .venv/bin/kappaflow-bench --state-dir /tmp/kfb/state ysb $args --rate 50000 --duration 60 --partitions 2 --out $OUT/$name 2>&1 | tail -12
done
echo "== done $(date -u +%FT%TZ)"
