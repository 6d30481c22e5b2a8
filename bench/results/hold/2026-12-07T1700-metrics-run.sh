#!/bin/bash
# One Debian 12 boot (2026-12-07, records bench/results/hold/2026-12-07T1700-*-metrics-*): first the kernel test that scrapes serve's
# metrics endpoint with curl (the endpoint now written in pipexctl), then bench/holdcalls.py --polls --metrics, 10,000
# calls, the heap trimmed every 10 s, the new code (wt-c, 91c7b95: serve without prometheus_client, lighter polls and scrapes) against
# 741ac44 (wt-base), alternated new, old, old, new, both running wt-c's bench.
R=$PIPEXCTL_RESULTS
cd /work/wt-c && PYTHONPATH=/work/wt-c /work/main/.venv/bin/python -m pytest -p no:cacheprovider -m kernel \
  tests/kernel/test_offload.py::test_offload_both_sides > $R/kernel-metrics-test.txt 2>&1
echo "$(date +%T) kernel test rc=$?" >> $R/summary.txt
B=/work/wt-c/bench
n=0
for t in new old old new; do
  n=$((n+1))
  d=/work/wt-base; [ $t = new ] && d=/work/wt-c
  cd $d && PYTHONPATH=$d /work/main/.venv/bin/python $B/holdcalls.py --calls 10000 \
    --trim-every 10 --polls --metrics --out $R/hold-$n-$t.json > $R/hold-$n-$t.txt 2>&1
  echo "$(date +%T) run $n $t rc=$?" >> $R/summary.txt
done
