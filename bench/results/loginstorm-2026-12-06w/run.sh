#!/bin/bash
# K = 100, a log xl2tpd writes itself, one boot, the unit's Nice=-20: kernel mode and three daemons alternated:
# "st" c8ac1ae (boot v's), "sc" f708219 (the /proc scan in a thread of its own; the log line's steps before the
# daemon's clock), "si" f708219 + the interpreter's switch interval at 1 ms.
R=$PIPEXCTL_RESULTS/w; mkdir -p $R
sysctl net.core.rmem_default net.core.rmem_max > $R/sysctl-before.txt
export PIPEXCTL_PLUGIN=/work/main/plugins/pipexctl.so
run() { mkdir -p "$R/$1-$2-$4-$3"; cd /work/wt-$1 && PIPEXCTL_RESULTS=$R/$1-$2-$4-$3 PYTHONPATH=/work/wt-$1 /work/main/.venv/bin/python /work/wt-$1/bench/loginstorm.py --k $4 --cases $2 --timeout 240 --rmem-default 4194304 --out $R/$1-$2-$4-$3/storm.json > $R/$1-$2-$4-$3/out.txt 2>&1; echo "$(date +%T) $1 $2 $4 $3 done" >> $R/progress.txt; }
run st c 1 100
run st d 1 100
run sc d 1 100
run si d 1 100
run sc d 2 100
run si d 2 100
run st d 2 100
run sc d 3 100
run si d 3 100
run st c 2 100
sysctl net.core.rmem_default net.core.rmem_max > $R/sysctl-after.txt
