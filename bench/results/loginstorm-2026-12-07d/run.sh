#!/bin/bash
# One Debian 12 boot (2026-12-07) at a1f323f (serve without pydantic; the code of 39909e1 with records.py's bool, str and
# bytes checks merged): after four bench/holdcalls.py runs (records bench/results/hold/2026-12-07T1345-*), a K = 100
# login storm, kernel mode and pipexctl alternated (c,d,d,c).
R=$PIPEXCTL_RESULTS
cd /work/main
.venv/bin/python bench/loginstorm.py --k 100 --cases c,d,d,c --out $R/loginstorm.json > $R/loginstorm.txt 2>&1
echo "$(date +%T) storm rc=$?" >> $R/summary.txt
