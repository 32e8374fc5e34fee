#!/bin/bash
# usage: jprof.sh PID N OUT -- N full thread dumps 1 s apart of executor task threads (RUNNABLE only)
PID=$1; N=$2; OUT=$3; : > $OUT
for i in $(seq $N); do
  jcmd $PID Thread.print 2>/dev/null | awk '/^"Executor task launch/{p=1; print "----"; next} p&&/^$/{p=0} p{print}' >> $OUT
  sleep 1
done
