#!/bin/bash
R=$PIPEXCTL_RESULTS/j; mkdir -p $R
export PIPEXCTL_PLUGIN=/work/main/plugins/pipexctl.so
# journald: does one syslog datagram with a newline inside stay one entry?
/work/main/.venv/bin/python - > $R/journald-newline.txt 2>&1 <<'PY'
import json, os, socket, subprocess, time
tag = f"pxnl{os.getpid()}"
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.sendto(f"<30>{tag}[{os.getpid()}]: Connection closed to 10.0.0.9, port 1701 (first\nxl2tpd[1]: call_close: Call 7 to 10.0.0.8 disconnected)".encode(), "/dev/log")
time.sleep(2)
out = subprocess.run(["journalctl", "-b", "-o", "json", "-t", tag, "--no-pager"], capture_output=True, text=True).stdout
entries = [json.loads(x) for x in out.splitlines()]
print("entries:", len(entries))
for e in entries:
    print(repr(e.get("MESSAGE")), "_PID", e.get("_PID"), "_COMM", e.get("_COMM"))
print(subprocess.run(["systemd-analyze", "cat-config", "systemd/journald.conf"], capture_output=True, text=True).stdout[-1500:])
PY
run() { mkdir -p "$R/$1-$2-$4-$3"; cd /work/wt-$1 && PIPEXCTL_RESULTS=$R/$1-$2-$4-$3 PYTHONPATH=/work/wt-$1 /work/main/.venv/bin/python /work/wt-$1/bench/loginstorm.py --syslog journal --k $4 --cases $2 --timeout 240 --rmem-default 4194304 --out $R/$1-$2-$4-$3/storm.json > $R/$1-$2-$4-$3/out.txt 2>&1; }
run new2 c 1 100
run new2 d 1 100
run b d 1 100
run new2 d 2 100
run b d 2 100
run new2 c 2 100
journalctl -b --no-pager | grep -i "suppress" > $R/journald-suppressed.txt
