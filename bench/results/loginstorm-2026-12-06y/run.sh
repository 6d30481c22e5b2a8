#!/bin/bash
# One boot, 23c069e, the unit's Nice=-20 for the daemon, a log xl2tpd writes itself: kernel mode (c) and
# pipexctl (d) at K = 100, with every LAC's xl2tpd and pppds at nice 19 ("n19") and at nice 0 ("n0"),
# alternated; then K = 153 with the LACs at nice 19.
# The rounds' directories (y-CASE-K-nN-ROUND) were renamed nN-CASE-K-ROUND before `bench/stormrecords.py keep`,
# which names a round NAME-CASE-K-ROUND. Code: 23c069e (--lac-nice; reverted after this boot).
R=$PIPEXCTL_RESULTS/y; mkdir -p $R
sysctl net.core.rmem_default net.core.rmem_max > $R/sysctl-before.txt
export PIPEXCTL_PLUGIN=/work/main/plugins/pipexctl.so
run() { d=$R/$1-$2-$4-n$5-$3; mkdir -p "$d"; cd /work/wt-$1 && PIPEXCTL_RESULTS=$d PYTHONPATH=/work/wt-$1 /work/main/.venv/bin/python /work/wt-$1/bench/loginstorm.py --k $4 --cases $2 --timeout 240 --rmem-default 4194304 --lac-nice $5 --out $d/storm.json > $d/out.txt 2>&1; echo "$(date +%T) $1 $2 $4 n$5 $3 done" >> $R/progress.txt; }
run y c 1 100 19
run y d 1 100 19
run y c 1 100 0
run y d 1 100 0
run y c 2 100 19
run y d 2 100 19
run y c 2 100 0
run y d 2 100 0
run y c 1 153 19
run y d 1 153 19
sysctl net.core.rmem_default net.core.rmem_max > $R/sysctl-after.txt
