#!/bin/bash
R=$PIPEXCTL_RESULTS/i; mkdir -p $R
export PIPEXCTL_PLUGIN=/work/main/plugins/pipexctl.so
run() { mkdir -p "$R/$1-$2-$4-$3"; cd /work/wt-$1 && PIPEXCTL_RESULTS=$R/$1-$2-$4-$3 PYTHONPATH=/work/wt-$1 /work/main/.venv/bin/python /work/wt-$1/bench/loginstorm.py --k $4 --cases $2 --timeout 240 --rmem-default ${RMEM:-4194304} --out $R/$1-$2-$4-$3/storm.json > $R/$1-$2-$4-$3/out.txt 2>&1; }
run new c 1 100
run new d 1 100
run old d 1 100
run new d 2 100
run old d 2 100
run new c 2 100
RMEM=0 run new d 3 100
RMEM=0 run new c 3 100
