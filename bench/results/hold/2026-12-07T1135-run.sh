#!/bin/bash
# One Debian 12 boot (2026-12-07, records 2026-12-07T1135-10000-REV-hold-polls-N-debian12.json): bench/holdcalls.py --polls,
# 10,000 calls, the heap trimmed every 10 s as serve does, serve's full polls (a /proc scan of the farm standing for
# the LNS's xl2tpd, its pppds showing an LNS pppd's argv, and a kernel dump) after the first read, every 1,000
# offloads and at rest.  4062273 ("new": 671acde's code: the scan one entry at a time, a known pppd's Proc sharing one empty tuple, indexed.put/drop)
# against 080b3ce ("old": the scan change before those), alternated new, old, old, new.  Each tree runs its own code and bench.
R=$PIPEXCTL_RESULTS
n=0
for t in new old old new; do
  n=$((n+1))
  cd /work/wt-$t && PYTHONPATH=/work/wt-$t /work/main/.venv/bin/python bench/holdcalls.py --calls 10000 \
    --trim-every 10 --polls --out $R/hold-$n-$t.json > $R/hold-$n-$t.txt 2>&1
  echo "$(date +%T) run $n $t rc=$?" >> $R/summary.txt
done
