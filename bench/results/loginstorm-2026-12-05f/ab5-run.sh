set -x
export PIPEXCTL_PLUGIN=/work/main/plugins/pipexctl.so
R="$PIPEXCTL_RESULTS"
run() { # tree case n k
  mkdir -p "$R/$1-$2-$4-$3"
  cd /work/wt-$1 && PIPEXCTL_RESULTS="$R/$1-$2-$4-$3" PYTHONPATH=/work/wt-$1 /work/main/.venv/bin/python /work/wt-$1/bench/loginstorm.py --k $4 --cases $2 --timeout 240 --rmem-default 4194304 --out "$R/$1-$2-$4-$3/storm.json"
}
run new c 1 153
run old d 1 153
run new d 1 153
run new d 2 153
run old d 2 153
run new c 2 153
