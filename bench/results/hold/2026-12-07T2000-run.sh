#!/bin/bash
# One Debian 12 boot (2026-12-07, stop 58; records bench/results/hold/2026-12-07T2000-*): first the kernel tests of the
# changed netlink readers and of the metrics endpoint, then bench/holdcalls.py --polls, 10,000 calls, the heap trimmed
# every 10 s, with --metrics and then without, the new code (wt-new: the metrics snapshot folded, the endpoint's text
# sent in pieces, polls holding session keys and letting the scan go before the kernel's dump) against dcd4a5b
# (wt-head, stop 57's last), alternated new, old, old, new, both running wt-new's bench.  Then login storms at K = 100,
# wt-new, c,d,d,c.
R=$PIPEXCTL_RESULTS
cd /work/wt-new && PYTHONPATH=/work/wt-new /work/main/.venv/bin/python -m pytest -p no:cacheprovider -m kernel \
  tests/kernel/test_backend_threads.py tests/kernel/test_offload.py::test_offload_both_sides > $R/kernel-tests.txt 2>&1
echo "$(date +%T) kernel tests rc=$?" >> $R/summary.txt
B=/work/wt-new/bench
for m in metrics plain; do
  n=0
  for t in new old old new; do
    n=$((n+1))
    d=/work/wt-head; [ $t = new ] && d=/work/wt-new
    flag=; [ $m = metrics ] && flag=--metrics
    cd $d && PYTHONPATH=$d /work/main/.venv/bin/python $B/holdcalls.py --calls 10000 \
      --trim-every 10 --polls $flag --out $R/hold-$m-$n-$t.json > $R/hold-$m-$n-$t.txt 2>&1
    echo "$(date +%T) $m run $n $t rc=$?" >> $R/summary.txt
  done
done
cd /work/wt-new
PYTHONPATH=/work/wt-new /work/main/.venv/bin/python bench/loginstorm.py --k 100 --cases c,d,d,c \
  --out $R/loginstorm-100.json > $R/loginstorm-100.txt 2>&1
echo "$(date +%T) storm 100 rc=$?" >> $R/summary.txt
