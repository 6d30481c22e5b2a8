#!/bin/bash
# K = 100, a log xl2tpd writes itself, one boot: kernel mode; b61f44f's daemon at the unit's Nice=-10 ("49") and
# the same code with the unit's line changed to Nice=-20 ("n20", a worktree edit; the bench runs the daemon at the
# unit's value), alternated.
R=$PIPEXCTL_RESULTS/u; mkdir -p $R
sysctl net.core.rmem_default net.core.rmem_max > $R/sysctl-before.txt
export PIPEXCTL_PLUGIN=/work/main/plugins/pipexctl.so
run() { mkdir -p "$R/$1-$2-$4-$3"; cd /work/wt-$1 && PIPEXCTL_RESULTS=$R/$1-$2-$4-$3 PYTHONPATH=/work/wt-$1 /work/main/.venv/bin/python /work/wt-$1/bench/loginstorm.py --k $4 --cases $2 --timeout 240 --rmem-default 4194304 --out $R/$1-$2-$4-$3/storm.json > $R/$1-$2-$4-$3/out.txt 2>&1; echo "$(date +%T) $1 $2 $4 $3 done" >> $R/progress.txt; }
run 49 c 1 100
run 49 d 1 100
run n20 d 1 100
run 49 d 2 100
run n20 d 2 100
run 49 d 3 100
run n20 d 3 100
run 49 c 2 100
sysctl net.core.rmem_default net.core.rmem_max > $R/sysctl-after.txt
