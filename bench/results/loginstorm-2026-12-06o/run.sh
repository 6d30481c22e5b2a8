#!/bin/bash
# Login storm A/B under rsyslog (--syslog: xl2tpd -l, rsyslog writes the LNS log, the daemon's log barrier):
# old 77c467a (the asker) vs new 8adc982 (the asker also sends the barrier after its answer), one boot.
R=$PIPEXCTL_RESULTS/o; mkdir -p $R
sysctl net.core.rmem_default net.core.rmem_max > $R/sysctl-before.txt
export PIPEXCTL_PLUGIN=/work/main/plugins/pipexctl.so
run() { mkdir -p "$R/$1-$2-$4-$3"; cd /work/wt-$1 && PIPEXCTL_RESULTS=$R/$1-$2-$4-$3 PYTHONPATH=/work/wt-$1 /work/main/.venv/bin/python /work/wt-$1/bench/loginstorm.py --k $4 --cases $2 --timeout 240 --rmem-default 4194304 --syslog rsyslog --out $R/$1-$2-$4-$3/storm.json > $R/$1-$2-$4-$3/out.txt 2>&1; echo "$(date +%T) $1 $2 $4 $3 done" >> $R/progress.txt; }
run new c 1 100
run new d 1 100
run old d 1 100
run new d 2 100
run old d 2 100
run new d 3 100
run old d 3 100
sysctl net.core.rmem_default net.core.rmem_max > $R/sysctl-after.txt
