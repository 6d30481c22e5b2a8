#!/bin/bash
# One Debian 12 boot (2026-12-07, records 2026-12-07T1345-10000-REV-hold-polls-N-debian12.json): bench/holdcalls.py
# --polls, 10,000 calls, the heap trimmed every 10 s as serve does, serve's full polls after the first read, every 1,000
# offloads and at rest.  39909e1 ("new": serve without pydantic, secrets and uuid) against ca77409 ("old": the last code
# with pydantic), alternated new, old, old, new; each tree runs its own code and bench.  Then a K = 100 login storm,
# kernel mode and pipexctl alternated (c,d,d,c), from /work/main, which was at a1f323f by then (39909e1's code with
# records.py's bool, str and bytes checks merged; records bench/results/loginstorm-2026-12-07d/).
R=$PIPEXCTL_RESULTS
n=0
for t in new old old new; do
  n=$((n+1))
  cd /work/wt-$t && PYTHONPATH=/work/wt-$t /work/main/.venv/bin/python bench/holdcalls.py --calls 10000 \
    --trim-every 10 --polls --out $R/hold-$n-$t.json > $R/hold-$n-$t.txt 2>&1
  echo "$(date +%T) run $n $t rc=$?" >> $R/summary.txt
done
cd /work/main
.venv/bin/python bench/loginstorm.py --k 100 --cases c,d,d,c --out $R/loginstorm.json > $R/loginstorm.txt 2>&1
echo "$(date +%T) storm rc=$?" >> $R/summary.txt
