#!/bin/bash
# One Debian 12 boot (2026-12-07, records bench/results/hold/2026-12-07T1600-* and bench/results/loginstorm-2026-12-07e/): bench/holdcalls.py --polls, 10,000 calls, the heap
# trimmed every 10 s as serve does, 666f9bf ("new": a start's read in 256 KiB pieces and the kernel asked before /proc,
# shared argv words, the status sent in pieces) against 741ac44 ("old"), alternated new, old, old, new; both run 666f9bf's
# bench (per-phase peaks; /proc/net/pppol2tp counted a line at a time).  Then login storms at 666f9bf, kernel mode and
# pipexctl alternated (c,d,d,c), K = 100 and then K = 153 (the lab's largest).
R=$PIPEXCTL_RESULTS
B=/work/wt-new/bench
n=0
for t in new old old new; do
  n=$((n+1))
  d=/work/wt-base; [ $t = new ] && d=/work/wt-new
  cd $d && PYTHONPATH=$d /work/main/.venv/bin/python $B/holdcalls.py --calls 10000 \
    --trim-every 10 --polls --out $R/hold-$n-$t.json > $R/hold-$n-$t.txt 2>&1
  echo "$(date +%T) run $n $t rc=$?" >> $R/summary.txt
done
cd /work/wt-new
for k in 100 153; do
  PYTHONPATH=/work/wt-new /work/main/.venv/bin/python bench/loginstorm.py --k $k --cases c,d,d,c \
    --out $R/loginstorm-$k.json > $R/loginstorm-$k.txt 2>&1
  echo "$(date +%T) storm $k rc=$?" >> $R/summary.txt
done
