#!/bin/bash
# K = 100 and 153, a log xl2tpd writes itself, one boot: kernel mode and c8ac1ae's daemon ("st": the plugin's ack
# stamped, the unit's Nice=-20), alternated; the question is where a slow request's hand-off goes.
R=$PIPEXCTL_RESULTS/v; mkdir -p $R
sysctl net.core.rmem_default net.core.rmem_max > $R/sysctl-before.txt
export PIPEXCTL_PLUGIN=/work/main/plugins/pipexctl.so
run() { mkdir -p "$R/$1-$2-$4-$3"; cd /work/wt-$1 && PIPEXCTL_RESULTS=$R/$1-$2-$4-$3 PYTHONPATH=/work/wt-$1 /work/main/.venv/bin/python /work/wt-$1/bench/loginstorm.py --k $4 --cases $2 --timeout 240 --rmem-default 4194304 --out $R/$1-$2-$4-$3/storm.json > $R/$1-$2-$4-$3/out.txt 2>&1; echo "$(date +%T) $1 $2 $4 $3 done" >> $R/progress.txt; }
run st c 1 100
run st d 1 100
run st d 2 100
run st c 1 153
run st d 1 153
run st d 3 100
run st d 2 153
run st c 2 100
run st c 2 153
sysctl net.core.rmem_default net.core.rmem_max > $R/sysctl-after.txt
