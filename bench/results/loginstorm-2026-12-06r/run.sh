#!/bin/bash
# K = 153, a log xl2tpd writes itself: one pipexctl round of ebeac57 (+50bb5d8's bench) under the CPU sampler every 0.02 s
# (--profile-cpu), to see where the daemon's CPU goes at K = 153; before it a kernel-mode and a pipexctl round
# unprofiled, for the CPU by program (the bench's by_command).
R=$PIPEXCTL_RESULTS/r; mkdir -p $R
export PIPEXCTL_PLUGIN=/work/main/plugins/pipexctl.so
cd /work/wt-prof
for c in c d; do mkdir -p $R/$c; PIPEXCTL_RESULTS=$R/$c PYTHONPATH=/work/wt-prof /work/main/.venv/bin/python bench/loginstorm.py --k 153 --cases $c --timeout 240 --rmem-default 4194304 --out $R/$c/storm.json > $R/$c/out.txt 2>&1; echo "$(date +%T) $c done" >> $R/progress.txt; done
PIPEXCTL_SAMPLE_INTERVAL=0.02 PIPEXCTL_RESULTS=$R PYTHONPATH=/work/wt-prof /work/main/.venv/bin/python bench/loginstorm.py --k 153 --cases d --timeout 240 --rmem-default 4194304 --profile-cpu --out $R/storm.json > $R/out.txt 2>&1
echo "$(date +%T) profile done" >> $R/progress.txt
