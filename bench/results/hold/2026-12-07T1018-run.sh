#!/bin/bash
# One Debian 12 boot (2026-12-07, records 2026-12-07T1018-10000-REV-hold-N-debian12.json): bench/holdcalls.py, 10,000 calls, the heap trimmed every 10 s as serve does,
# 0d415bb ("new": 9c75809 and a call's pppd argv kept only until its pppd is known, not interned; the status encoded a row at a time)
# against fdb980f ("old", stop 54's last), alternated new, old, old, new, new, old.  Each tree runs its own code;
# the old tree was given the new tree's bench/holdcalls.py and pipexctl/testing/probe.py (the allocator's figures)
# and bench/farm.py, so both measure alike.  The synthetic log gives each call its own pty and address pair in its argv.
R=$PIPEXCTL_RESULTS
n=0
for t in new old old new new old; do
  n=$((n+1))
  cd /work/wt-$t && PYTHONPATH=/work/wt-$t /work/main/.venv/bin/python bench/holdcalls.py --calls 10000 \
    --trim-every 10 --out $R/hold-$n-$t.json > $R/hold-$n-$t.txt 2>&1
  echo "$(date +%T) run $n $t rc=$?" >> $R/summary.txt
done
