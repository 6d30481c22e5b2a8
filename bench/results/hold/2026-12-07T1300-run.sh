#!/bin/bash
# One Debian 12 boot (2026-12-07): bench/holdcalls.py --polls, 10,000 calls, the heap trimmed every 10 s as serve does,
# serve's full polls after the first read, every 1,000 offloads and at rest.  d575299 ("new": serve without pydantic,
# records.py) against ca77409 ("old": the last code with pydantic), alternated new, old, old, new.  Each tree runs its own code and bench.
R=$PIPEXCTL_RESULTS
n=0
for t in new old old new; do
  n=$((n+1))
  cd /work/wt-$t && PYTHONPATH=/work/wt-$t /work/main/.venv/bin/python bench/holdcalls.py --calls 10000 \
    --trim-every 10 --polls --out $R/hold-$n-$t.json > $R/hold-$n-$t.txt 2>&1
  echo "$(date +%T) run $n $t rc=$?" >> $R/summary.txt
done
