#!/bin/bash
# One Debian 12 boot (2026-12-07, stop 58): the daemon's priority at K = 153 and Debian's default socket buffer.
# dcd4a5b throughout; kernel mode (c), pipexctl at the unit's Nice=-20 (d) and at nice 0 (u), in the order c,d,u,c,u,d.
R=$PIPEXCTL_RESULTS
cd /work/wt-head
PYTHONPATH=/work/wt-head /work/main/.venv/bin/python bench/loginstorm.py --k 153 --cases c,d,u,c,u,d \
  --out $R/loginstorm-153.json > $R/loginstorm-153.txt 2>&1
echo "$(date +%T) storm 153 rc=$?" >> $R/summary.txt
