#!/bin/bash
# One Debian 12 boot (2026-12-07, stop 58; records bench/results/loginstorm-2026-12-07h/): where a K = 100 storm's
# added CPU goes. 4e621ca (wt-new) throughout; kernel mode (c), pipexctl (d), and pipexctl with pipexctl_move 0 (n: no
# plugin timer, no control link), in the order c,d,n,c,n,d, Debian's default socket buffer.
R=$PIPEXCTL_RESULTS
cd /work/wt-new
PYTHONPATH=/work/wt-new /work/main/.venv/bin/python bench/loginstorm.py --k 100 --cases c,d,n,c,n,d \
  --out $R/loginstorm-100.json > $R/loginstorm-100.txt 2>&1
echo "$(date +%T) storm 100 rc=$?" >> $R/summary.txt
