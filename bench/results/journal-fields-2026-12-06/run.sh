# Debian 12 guest with systemd as PID 1, from the project root:
#   .venv/bin/python -m pipexctl.testing.vm --init systemd --memory 4096 --timeout 1800 --keep-results DIR -- bash bench/results/journal-fields-2026-12-06/run.sh
# 20,000 entries sent by a process named xl2tpd, journald rate limit off; then measure.py:
# journalctl alone (3 runs each way) and the daemon's Journal + LineParser first read (2 each way).
set -x
mkdir -p /etc/systemd/journald.conf.d
printf '[Journal]\nRateLimitBurst=0\nRateLimitIntervalSec=0\n' > /etc/systemd/journald.conf.d/norate.conf
systemctl restart systemd-journald
# entries sent by a process whose _COMM and _EXE are xl2tpd (python exec'd as xl2tpd)
cp "$(readlink -f /work/main/.venv/bin/python)" /tmp/xl2tpd
/tmp/xl2tpd - <<'PY'
import socket, os
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); s.connect("/dev/log")
for i in range(20000):
    s.send(f"<30>xl2tpd[{os.getpid()}]: Call established with 10.1.{i//250}.{i%250+1}, PID: {1000+i}, Local: {i+1}, Remote: {i+5}, Serial: 1".encode())
PY
sleep 3
journalctl -b -t xl2tpd --no-pager | wc -l
/work/main/.venv/bin/python /work/main/bench/results/journal-fields-2026-12-06/measure.py | tee $PIPEXCTL_RESULTS/measure.json
