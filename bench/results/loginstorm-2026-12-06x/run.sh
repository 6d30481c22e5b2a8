#!/bin/bash
# K = 100, a log xl2tpd writes itself, one boot, the unit's Nice=-20: kernel mode and 611e024's daemon with the
# interpreter's switch interval at 1 ms ("x1", as committed) and at Python's 5 ms ("x0", a worktree edit of
# SWITCH_INTERVAL), alternated.
R=$PIPEXCTL_RESULTS/x; mkdir -p $R
sysctl net.core.rmem_default net.core.rmem_max > $R/sysctl-before.txt
export PIPEXCTL_PLUGIN=/work/main/plugins/pipexctl.so
run() { mkdir -p "$R/$1-$2-$4-$3"; cd /work/wt-$1 && PIPEXCTL_RESULTS=$R/$1-$2-$4-$3 PYTHONPATH=/work/wt-$1 /work/main/.venv/bin/python /work/wt-$1/bench/loginstorm.py --k $4 --cases $2 --timeout 240 --rmem-default 4194304 --out $R/$1-$2-$4-$3/storm.json > $R/$1-$2-$4-$3/out.txt 2>&1; echo "$(date +%T) $1 $2 $4 $3 done" >> $R/progress.txt; }
run x1 c 1 100
run x0 d 1 100
run x1 d 1 100
run x0 d 2 100
run x1 d 2 100
run x0 d 3 100
run x1 d 3 100
run x1 c 2 100
sysctl net.core.rmem_default net.core.rmem_max > $R/sysctl-after.txt
