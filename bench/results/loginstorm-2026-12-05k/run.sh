#!/bin/bash
R=$PIPEXCTL_RESULTS/k; mkdir -p $R
export PIPEXCTL_PLUGIN=/work/main/plugins/pipexctl.so
run() { mkdir -p "$R/$1-$2-$4-$3"; cd /work/main && PIPEXCTL_RESULTS=$R/$1-$2-$4-$3 /work/main/.venv/bin/python /work/main/bench/loginstorm.py --k $4 --cases $2 --timeout 240 --rmem-default 212992 --out $R/$1-$2-$4-$3/storm.json > $R/$1-$2-$4-$3/out.txt 2>&1; }
run main c 1 100
run main d 1 100
run main d 2 100
run main c 2 100
