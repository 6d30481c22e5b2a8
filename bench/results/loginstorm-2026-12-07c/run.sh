#!/bin/bash
# One Debian 12 boot (2026-12-07) at 438e3c4 (the code of 671acde; docs only since): a K = 100 login storm, kernel mode and pipexctl alternated (c,d,d,c), then 12 x 25 real calls through one daemon (make scale's bench/scalecalls.py, record bench/results/scale/2026-12-07T1149-12x25-debian12.json).
R=$PIPEXCTL_RESULTS
cd /work/main
.venv/bin/python bench/loginstorm.py --k 100 --cases c,d,d,c --out $R/loginstorm.json > $R/loginstorm.txt 2>&1
echo "$(date +%T) storm rc=$?" >> $R/summary.txt
.venv/bin/python bench/scalecalls.py --lacs 12 --sections 25 > $R/scale.txt 2>&1
echo "$(date +%T) scale rc=$?" >> $R/summary.txt
