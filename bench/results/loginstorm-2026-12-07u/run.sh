#!/bin/bash
# One Debian 12 boot (2026-12-07, stop 59): login storms at K = 100, Debian's default socket buffer, kernel mode (c),
# 61e7ddb (C: the collector's long pauses logged) and 0952403 (D: the same with gc.freeze() at serve's start, so the collector
# skips what the imports made), in the order c,C,D,c,D,C.
R=$PIPEXCTL_RESULTS
export PIPEXCTL_PLUGIN=/work/main/plugins/pipexctl.so
S=$R/storms; mkdir -p $S
run() { mkdir -p "$S/$1-$2-$4-$3"; cd /work/wt-$1 && PIPEXCTL_RESULTS=$S/$1-$2-$4-$3 PYTHONPATH=/work/wt-$1 /work/main/.venv/bin/python /work/wt-$1/bench/loginstorm.py --k $4 --cases $2 --timeout 240 --out $S/$1-$2-$4-$3/storm.json > $S/$1-$2-$4-$3/out.txt 2>&1; echo "$(date +%T) $1 $2 $4 $3 rc=$?" >> $R/summary.txt; }
run C c 1 100
run C d 1 100
run D d 1 100
run C c 2 100
run D d 2 100
run C d 2 100
