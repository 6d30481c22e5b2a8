"""How long a `pipexctl serve` start reads its logs: from the start, and
from a discovery checkpoint (discovery/checkpoint.py).

A synthetic syslog of a busy LNS: ``--history`` calls that came and went
(each a tunnel line, the pppd argv, "Call established", "call_close",
"Terminating pppd", the tunnel's close) and ``--live`` calls still up, in
the traditional syslog format.  Then, with the daemon's own CallWatch and
Discovery (no /proc or kernel: what is timed is the log read):

1. a first read with no checkpoint (what every start did before);
2. the save at stop (time under the lock, size);
3. 1,000 more calls logged while the daemon was down, then a start that
   resumes from the checkpoint;
4. a start from nothing on the same, longer file.

The two starts must end with the same model (checked).

    python bench/startup.py [--history 100000] [--live 10000]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipexctl.discovery import checkpoint  # noqa: E402
from pipexctl.discovery.discovery import Discovery  # noqa: E402
from pipexctl.offload.watch import CallWatch  # noqa: E402

PREFIX = "Dec  2 06:00:00 lns xl2tpd[100]: "


def calls(first: int, n: int, *, ended: bool) -> list[str]:
    out = []
    per = 10
    for t in range(n // per):
        tid = (first // per + t) % 60000 + 1
        peer = f"10.{(tid >> 8) & 255}.{tid & 255}.2"
        out.append(f"Connection established to {peer}, 1701.  Local: {tid}, Remote: {tid + 1} (ref=0/0).  "
                   f"LNS session is 'default'")
        for c in range(per):
            cid = (first + t * per + c) % 60000 + 1
            pid = 100000 + cid
            out += ["start_pppd: I'm running: ", '"/usr/sbin/pppd" ', '"passive" ', '"nodetach" ', '"file" ',
                    '"/etc/ppp/options.xl2tpd" ', f'"/dev/pts/{c}" ',
                    f"Call established with {peer}, PID: {pid}, Local: {cid}, Remote: {cid}, Serial: {c + 1}"]
            if ended:
                out += [f"call_close: Call {cid} to {peer} disconnected",
                        f"Terminating pppd: sending TERM signal to pid {pid}"]
        if ended:
            out.append(f"control_finish: Connection closed to {peer}, port 1701 (Goodbye!), Local: {tid}, "
                       f"Remote: {tid + 1}")
    return [PREFIX + ln for ln in out]


def start(log: Path, cp: Path) -> tuple[CallWatch, float]:
    w = CallWatch(Discovery([str(log)], proc=False, kernel=False), checkpoint_path=str(cp))
    t = time.monotonic()
    w.first_read()
    return w, time.monotonic() - t


def model(w: CallWatch) -> list:
    return sorted((c.tunnel_id, c.call_id, c.pppd_pid) for c in w.discovery.tracker.calls())


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--history", type=int, default=100000, help="calls that came and went before")
    p.add_argument("--live", type=int, default=10000, help="calls up at the stop")
    p.add_argument("--out", default=os.path.join(os.environ.get("PIPEXCTL_RESULTS", "."), "startup.json"))
    a = p.parse_args()
    d = Path(tempfile.mkdtemp())
    try:
        log = d / "syslog"
        log.write_text("\n".join([PREFIX + "xl2tpd version xl2tpd-1.3.18 started on lns PID:100"]
                                 + calls(0, a.history, ended=True) + calls(a.history, a.live, ended=False)) + "\n")
        size = log.stat().st_size
        w, cold = start(log, d / "none.json")
        lines = w.discovery.lines_read()
        cp = d / "discovery.json"
        w.checkpoint_path = str(cp)
        t = time.monotonic()
        w.save_checkpoint()
        save = time.monotonic() - t
        with w.lock:  # the part of the save the lock covers: the rest is the write
            t = time.monotonic()
            checkpoint.encode(w.discovery.checkpoint())
            locked = time.monotonic() - t
        w.discovery.close()
        with log.open("a") as f:
            f.write("\n".join(calls(a.history + a.live, 1000, ended=False)) + "\n")
        w2, warm = start(log, cp)
        resumed_lines = w2.discovery.lines_read()
        w3, cold2 = start(log, d / "none.json")
        same = model(w2) == model(w3)
        live = len(w3.discovery.tracker.calls())
        for w in (w2, w3):
            w.discovery.close()
        res = {"log_bytes": size, "log_lines": lines, "history_calls": a.history, "live_calls": a.live,
               "cold_start_s": cold, "save_s": save, "save_locked_s": locked, "checkpoint_bytes": cp.stat().st_size,
               "cold_start_after_s": cold2, "resumed_start_s": warm, "resumed_lines": resumed_lines,
               "live_after": live, "same_model": same}
        print(f"syslog {size / 1e6:.1f} MB, {lines} lines ({a.history} calls came and went, {a.live} up)")
        print(f"start reading it whole: {cold:.2f} s")
        print(f"save at stop: {save * 1000:.0f} ms ({locked * 1000:.0f} ms of it under the lock), "
              f"checkpoint {cp.stat().st_size / 1e6:.1f} MB")
        print(f"then 1,000 more calls logged: start from the checkpoint {warm:.2f} s ({resumed_lines} lines read) "
              f"against {cold2:.2f} s from the start ({cold2 / warm:.0f} x); same model: {same} ({live} calls)")
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(res, indent=1))
        return 0 if same and live == a.live + 1000 else 1
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
