#!/bin/bash
# One Debian 12 boot (2026-12-07, records 2026-12-07T0755-10000-REV-hold-N-debian12.json): bench/holdcalls.py, 10,000 calls, the heap trimmed every 10 s as serve does,
# a61d191 ("new": pydantic's plugin loader left out, a tunnel's sessions as one (call id, record) pair, the pidfds in a dict of ints, the local address interned)
# against e4f4939 ("old", stop 53's last), alternated new, old, old, new.  Each tree runs its own code.
R=$PIPEXCTL_RESULTS
n=0
for t in new old old new; do
  n=$((n+1))
  cd /work/wt-$t && PYTHONPATH=/work/wt-$t /work/main/.venv/bin/python bench/holdcalls.py --calls 10000 \
    --trim-every 10 --out $R/hold-$n-$t.json > $R/hold-$n-$t.txt 2>&1
  echo "$(date +%T) run $n $t rc=$?" >> $R/summary.txt
done
