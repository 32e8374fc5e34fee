#!/bin/bash
# Wait for the after side's job JVM (state dir /tmp/kf-parse/state, a job's app name), then
# take 40 thread dumps of its task threads 1 s apart, from 25 s after it appears.
OUT=/tmp/kf-parse/res/count-ab/thread-samples.txt
while true; do
  PID=$(ps -eo pid,args | grep -v grep | grep java | grep "/tmp/kf-parse/state/" | grep "spark.app.name=kappaflow:" | grep -v "class-data\|bench" | awk '{print $1}' | head -1)
  [ -n "$PID" ] && break
  sleep 1
done
echo "pid $PID $(date +%T)"
sleep 25
/work/wt-parse/benchmarks/results/count/2026-11-29-ceiling-throughput/profile/jprof.sh $PID 40 $OUT
echo "done $(date +%T)"
