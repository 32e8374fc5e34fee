#!/bin/bash
# YSB at 10k on the job API: after (the change) then before (36a2eea), back to back
. /tmp/kf-perf/env.sh
cd /tmp/kf-perf/pb
K=/work/wt-perf/.venv/bin
out=/tmp/kf-perf/pb/res/ysb10
mkdir -p $out
$K/kappaflow --state-dir /tmp/kf-perf/state down >/dev/null 2>&1
for side in after before; do
  if [ $side = before ]; then export PYTHONPATH=/tmp/kf-perf/base/src:/tmp/kf-perf/base/benchmarks; st=/tmp/kf-perf/state-base; else unset PYTHONPATH; st=/tmp/kf-perf/state; fi
  echo "== $side $(date +%T) $(uptime)"
  timeout 900 $K/kappaflow-bench --state-dir $st ysb --engine kappaflow --rate 10000 --duration 30 --warmup 30 --partitions 2 --out $out/$side > $out/$side.console.log 2>&1
  echo "rc $? $(date +%T) $(uptime)"
  tail -25 $out/$side.console.log
  cp $st/jobs/ysb-kappaflow-*/driver.log $out/$side.driver.log 2>/dev/null
  $K/kappaflow --state-dir $st down >/dev/null 2>&1
done
echo "== done $(date +%T)"
