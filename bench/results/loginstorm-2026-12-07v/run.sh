#!/bin/bash
# One Debian 12 boot (2026-12-07, stop 59): the kernel test of the offload at 9ad5d6a, then login storms at K = 100,
# Debian's default socket buffer, kernel mode (c) and 9ad5d6a (C: request threads started ahead, the heap trimmed before
# full polls and metrics snapshots, the accept loop's wake logged), in the order c,C,C,c,C,C; then
# bench/holdcalls.py --polls --metrics at 10,000 calls, 9ad5d6a (C) against 1fe144a (B: no trim before those peaks),
# C,B,B,C, both with 9ad5d6a's bench.
R=$PIPEXCTL_RESULTS
export PIPEXCTL_PLUGIN=/work/main/plugins/pipexctl.so
cd /work/wt-C && PYTHONPATH=/work/wt-C /work/main/.venv/bin/python -m pytest -p no:cacheprovider -m kernel \
  tests/kernel/test_offload.py::test_offload_both_sides > $R/kernel-tests.txt 2>&1
echo "$(date +%T) kernel tests rc=$?" >> $R/summary.txt
S=$R/storms; mkdir -p $S
run() { mkdir -p "$S/$1-$2-$4-$3"; cd /work/wt-$1 && PIPEXCTL_RESULTS=$S/$1-$2-$4-$3 PYTHONPATH=/work/wt-$1 /work/main/.venv/bin/python /work/wt-$1/bench/loginstorm.py --k $4 --cases $2 --timeout 240 --out $S/$1-$2-$4-$3/storm.json > $S/$1-$2-$4-$3/out.txt 2>&1; echo "$(date +%T) $1 $2 $4 $3 rc=$?" >> $R/summary.txt; }
run C c 1 100
run C d 1 100
run C d 2 100
run C c 2 100
run C d 3 100
run C d 4 100
n=0
for t in C B B C; do
  n=$((n+1))
  cd /work/wt-$t && PYTHONPATH=/work/wt-$t /work/main/.venv/bin/python /work/wt-C/bench/holdcalls.py --calls 10000 \
    --trim-every 10 --polls --metrics --out $R/hold-metrics-$n-$t.json > $R/hold-metrics-$n-$t.txt 2>&1
  echo "$(date +%T) hold metrics $n $t rc=$?" >> $R/summary.txt
done
