#!/bin/bash
# count before (f7a7936, the base) then after (the change), back to back
. /tmp/kf-parse/env.sh; export KAPPAFLOW_MQTT__PORT=52883
K=/work/wt-parse/.venv/bin
out=/tmp/kf-parse/res/count-ab
ROUND=${ROUND:-1}
mkdir -p $out
for side in before after; do
  if [ $side = before ]; then export PYTHONPATH=/tmp/kf-parse/base/src:/tmp/kf-parse/base/benchmarks; st=/tmp/kf-parse/state-base; cd /tmp/kf-parse/base; else unset PYTHONPATH; st=/tmp/kf-parse/state; cd /work/wt-parse; fi
  echo "== $side round $ROUND $(date +%T) $(uptime)"
  $K/python -c "import kappaflow, kappaflow_bench; print(kappaflow.__file__, kappaflow_bench.__file__)"
  $K/kappaflow --state-dir $st setup > $out/$side$ROUND-setup.log 2>&1
  timeout 1500 $K/kappaflow-bench --state-dir $st count --measure ceiling,throughput --events 2000000 --out $out/$side$ROUND > $out/$side$ROUND.console.log 2>&1
  echo "rc $? $(date +%T) $(uptime)"
  tail -20 $out/$side$ROUND.console.log
  $K/kappaflow --state-dir $st down >/dev/null 2>&1
done
echo "== done $(date +%T)"
