#!/bin/bash
# One Debian 12 boot (2026-12-07) at 4c5ed4b: K = 100, one pipexctl round under the CPU sampler every 0.02 s (--profile-cpu), to see where the daemon's CPU goes now.
R=$PIPEXCTL_RESULTS
export PIPEXCTL_PLUGIN=/work/main/plugins/pipexctl.so
cd /work/wt-new
PIPEXCTL_SAMPLE_INTERVAL=0.02 PYTHONPATH=/work/wt-new /work/main/.venv/bin/python bench/loginstorm.py --k 100 --cases d --timeout 300 --profile-cpu --out $R/storm.json > $R/out.txt 2>&1
echo "$(date +%T) profile rc=$?" >> $R/summary.txt
