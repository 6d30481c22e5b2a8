cd /work/main
R=$PIPEXCTL_RESULTS
for v in 0 10 0 10; do
  n=$((n+1))
  .venv/bin/python bench/holdcalls.py --calls 10000 --trim-every $v --out $R/hold-$n-trim$v.json > $R/hold-$n-trim$v.txt 2>&1
  echo "run $n trim $v rc=$?" >> $R/summary.txt
done
.venv/bin/python bench/holdcalls.py --calls 10000 --trace --out $R/hold-trace.json > $R/hold-trace.txt 2>&1
echo "trace rc=$?" >> $R/summary.txt
