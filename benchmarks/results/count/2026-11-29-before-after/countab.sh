#!/bin/bash
# count before (36a2eea) then after (the change), back to back
. /tmp/kf-perf/env.sh
cd /tmp/kf-perf/pb
K=/work/wt-perf/.venv/bin
out=/tmp/kf-perf/pb/res/count-ab
mkdir -p $out
$K/kappaflow --state-dir /tmp/kf-perf/state down >/dev/null 2>&1
for side in before after; do
  if [ $side = before ]; then export PYTHONPATH=/tmp/kf-perf/base/src:/tmp/kf-perf/base/benchmarks; st=/tmp/kf-perf/state-base; else unset PYTHONPATH; st=/tmp/kf-perf/state; fi
  echo "== $side $(date +%T) $(uptime)"
  $K/python -c "import kappaflow, kappaflow_bench; print(kappaflow.__file__, kappaflow_bench.__file__)"
  $K/kappaflow --state-dir $st setup > $out/$side-setup.log 2>&1
  timeout 1500 $K/kappaflow-bench --state-dir $st count --measure ceiling,throughput --events 2000000 --out $out/$side > $out/$side.console.log 2>&1
  echo "rc $? $(date +%T) $(uptime)"
  tail -20 $out/$side.console.log
  $K/kappaflow --state-dir $st down >/dev/null 2>&1
done
echo "== done $(date +%T)"
