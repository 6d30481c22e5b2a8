"""How long a syslog datagram takes to come out of `journalctl -f -o json`
(systemd guest), alone and beside a flood of other entries."""
import json
import os
import socket
import subprocess
import threading
import time


def jd_cpu():
    pid = subprocess.run(["pidof", "systemd-journald"], capture_output=True, text=True).stdout.split()[0]
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")

def run(name, rate, n, flood_rate, fields, stdbuf=False):
    tag = f"pxlat{os.getpid()}{name}"
    argv = (["stdbuf", "-oL"] if stdbuf else []) + ["journalctl", "-f", "-n", "0", "-o", "json", "-t", tag] + (["--output-fields=MESSAGE,_PID"] if fields else [])
    p = subprocess.Popen(argv, stdout=subprocess.PIPE)
    time.sleep(2)
    got = {}
    def reader():
        for line in p.stdout:
            t = time.monotonic()
            try:
                msg = json.loads(line)["MESSAGE"]
            except Exception:
                continue
            got[int(msg.split()[1])] = t
    th = threading.Thread(target=reader, daemon=True)
    th.start()
    stop = threading.Event()
    def flood():
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        i = 0
        while not stop.is_set():
            s.sendto(f"<30>pxflood[{os.getpid()}]: some pppd-like line number {i} with text".encode(), "/dev/log")
            i += 1
            time.sleep(1 / flood_rate)
    if flood_rate:
        threading.Thread(target=flood, daemon=True).start()
    c0 = jd_cpu()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sent = {}
    t0 = time.monotonic()
    for i in range(n):
        sent[i] = time.monotonic()
        s.sendto(f"<30>{tag}[{os.getpid()}]: seq {i} Call established with 10.99.1.2, PID: 1234, Local: 1, Remote: 2, Serial: 1".encode(), "/dev/log")
        time.sleep(1 / rate)
    end = time.monotonic() + 10
    while len(got) < n and time.monotonic() < end:
        time.sleep(0.1)
    before = len(got)
    s.sendto(f"<30>{tag}[{os.getpid()}]: seq {n} a later entry".encode(), "/dev/log")
    time.sleep(3)
    print(f"  missing after 10 s: {n - before}; after one more entry and 3 s: {n + 1 - len(got)}", flush=True)
    stop.set()
    dur = time.monotonic() - t0
    lag = sorted((got[i] - sent[i]) * 1000 for i in got if i in sent)
    p.kill()
    print(f"{name}: rate {rate}/s, flood {flood_rate}/s, output-fields {fields}: got {len(got)}/{n}; lag ms p50 {lag[len(lag)//2]:.0f} "
          f"p90 {lag[int(len(lag)*.9)]:.0f} p99 {lag[int(len(lag)*.99)]:.0f} max {lag[-1]:.0f}; journald CPU {jd_cpu()-c0:.1f} s in {dur:.0f} s", flush=True)

run("alone", 20, 300, 0, False)
run("alone-stdbuf", 20, 300, 0, False, stdbuf=True)
run("flood100", 20, 300, 100, False)
run("flood100-stdbuf", 20, 300, 100, False, stdbuf=True)
print(subprocess.run("journalctl -b --no-pager | grep -i suppress | tail -5", shell=True, capture_output=True, text=True).stdout)
