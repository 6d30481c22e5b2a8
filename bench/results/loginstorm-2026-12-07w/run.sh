#!/bin/bash
# One Debian 12 boot (2026-12-07, stop 59): the kernel test of the plugin's new ack (pppd's own wait for a CPU), then
# login storms at K = 100, Debian's default socket buffer, kernel mode (c), 1664c1b (A: a thread started per request,
# the accept loop waiting in Thread.start()) and 1fe144a (B: request threads started ahead), in the order c,A,B,c,B,A,
# both with the new plugin; then bench/holdcalls.py --polls --metrics at 10,000 calls, B,A,A,B (B's spare threads).
R=$PIPEXCTL_RESULTS
export PIPEXCTL_PLUGIN=/work/main/plugins/pipexctl.so
cd /work/wt-B && PYTHONPATH=/work/wt-B /work/main/.venv/bin/python -m pytest -p no:cacheprovider -m kernel \
  tests/kernel/test_offload.py::test_offload_both_sides > $R/kernel-tests.txt 2>&1
echo "$(date +%T) kernel tests rc=$?" >> $R/summary.txt
S=$R/storms; mkdir -p $S
run() { mkdir -p "$S/$1-$2-$4-$3"; cd /work/wt-$1 && PIPEXCTL_RESULTS=$S/$1-$2-$4-$3 PYTHONPATH=/work/wt-$1 /work/main/.venv/bin/python /work/wt-$1/bench/loginstorm.py --k $4 --cases $2 --timeout 240 --out $S/$1-$2-$4-$3/storm.json > $S/$1-$2-$4-$3/out.txt 2>&1; echo "$(date +%T) $1 $2 $4 $3 rc=$?" >> $R/summary.txt; }
run B c 1 100
run A d 1 100
run B d 1 100
run B c 2 100
run B d 2 100
run A d 2 100
n=0
for t in B A A B; do
  n=$((n+1))
  cd /work/wt-$t && PYTHONPATH=/work/wt-$t /work/main/.venv/bin/python /work/wt-B/bench/holdcalls.py --calls 10000 \
    --trim-every 10 --polls --metrics --out $R/hold-metrics-$n-$t.json > $R/hold-metrics-$n-$t.txt 2>&1
  echo "$(date +%T) hold metrics $n $t rc=$?" >> $R/summary.txt
done
