#!/bin/bash
# K = 153, a log xl2tpd writes itself, one boot: kernel mode, b99220f ("old": no asker) and ebeac57 ("new": the asker),
# alternated, every round timed by the bench's rtnetlink events (4238aaa's bench in both checkouts).
R=$PIPEXCTL_RESULTS/q; mkdir -p $R
sysctl net.core.rmem_default net.core.rmem_max > $R/sysctl-before.txt
export PIPEXCTL_PLUGIN=/work/main/plugins/pipexctl.so
run() { mkdir -p "$R/$1-$2-$4-$3$5"; cd /work/wt-$1 && PIPEXCTL_RESULTS=$R/$1-$2-$4-$3$5 PYTHONPATH=/work/wt-$1 /work/main/.venv/bin/python /work/wt-$1/bench/loginstorm.py --k $4 --cases $2 --timeout 240 --rmem-default 4194304 $6 --out $R/$1-$2-$4-$3$5/storm.json > $R/$1-$2-$4-$3$5/out.txt 2>&1; echo "$(date +%T) $1 $2 $4 $3$5 done" >> $R/progress.txt; }
run new c 1 153 "" ""
run new d 1 153 "" ""
run old d 1 153 "" ""
run new d 2 153 "" ""
run old d 2 153 "" ""
run new c 2 153 "" ""
run old d 3 153 "" ""
run new d 3 153 "" ""
sysctl net.core.rmem_default net.core.rmem_max > $R/sysctl-after.txt
