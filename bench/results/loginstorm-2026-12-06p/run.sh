#!/bin/bash
# (1) Through rsyslog: old 77c467a (the asker) vs new 6ceca2a (its barrier sent with its answer; at most one question per 0.2 s), K = 100,
#     alternated, to see whether the call's-line waits of about a second (boot o, new code) recur.
# (2) K = 153, a log xl2tpd writes itself: kernel mode, then 6ceca2a.
R=$PIPEXCTL_RESULTS/p; mkdir -p $R
sysctl net.core.rmem_default net.core.rmem_max > $R/sysctl-before.txt
export PIPEXCTL_PLUGIN=/work/main/plugins/pipexctl.so
run() { mkdir -p "$R/$1-$2-$4-$3$5"; cd /work/wt-$1 && PIPEXCTL_RESULTS=$R/$1-$2-$4-$3$5 PYTHONPATH=/work/wt-$1 /work/main/.venv/bin/python /work/wt-$1/bench/loginstorm.py --k $4 --cases $2 --timeout 240 --rmem-default 4194304 $6 --out $R/$1-$2-$4-$3$5/storm.json > $R/$1-$2-$4-$3$5/out.txt 2>&1; echo "$(date +%T) $1 $2 $4 $3$5 done" >> $R/progress.txt; }
run new d 1 100 -rsyslog "--syslog rsyslog"
run old d 1 100 -rsyslog "--syslog rsyslog"
run new d 2 100 -rsyslog "--syslog rsyslog"
run old d 2 100 -rsyslog "--syslog rsyslog"
run new d 3 100 -rsyslog "--syslog rsyslog"
run old d 3 100 -rsyslog "--syslog rsyslog"
run new c 1 153 "" ""
run new d 1 153 "" ""
sysctl net.core.rmem_default net.core.rmem_max > $R/sysctl-after.txt
