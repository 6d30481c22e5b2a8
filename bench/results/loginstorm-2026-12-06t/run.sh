#!/bin/bash
# K = 153, a log xl2tpd writes itself, one boot: kernel mode; "old" b398031 (the asker's gap grows with its CPU)
# and "new" b61f44f (stop 49's end: one reply directory per client, the control pipe's owner by one stat), alternated.
R=$PIPEXCTL_RESULTS/t; mkdir -p $R
sysctl net.core.rmem_default net.core.rmem_max > $R/sysctl-before.txt
export PIPEXCTL_PLUGIN=/work/main/plugins/pipexctl.so
run() { mkdir -p "$R/$1-$2-$4-$3"; cd /work/wt-$1 && PIPEXCTL_RESULTS=$R/$1-$2-$4-$3 PYTHONPATH=/work/wt-$1 /work/main/.venv/bin/python /work/wt-$1/bench/loginstorm.py --k $4 --cases $2 --timeout 240 --rmem-default 4194304 --out $R/$1-$2-$4-$3/storm.json > $R/$1-$2-$4-$3/out.txt 2>&1; echo "$(date +%T) $1 $2 $4 $3 done" >> $R/progress.txt; }
run 49 c 1 153
run 49 d 1 153
run share d 1 153
run 49 d 2 153
run share d 2 153
run 49 c 2 153
sysctl net.core.rmem_default net.core.rmem_max > $R/sysctl-after.txt
