"""A burst of requests against `pipexctl serve`'s accept loop, on the host
(no kernel needed; not a test, it asserts nothing).

The daemon (OffloadServer with the null backend and data path, no xl2tpd)
serves in this process; a child process opens K connections ``--gap`` ms
apart, each asking the status op, and times each from its connect to its
reply.  A thread in the daemon's process stands in for discovery's polls:
it holds the interpreter's lock in ``--busy`` ms bursts every ``--every``
ms (0: none), which is what a new request thread has to get before it
runs.  What is timed is the accept loop's hand-off, not an offload.

Compare code with two trees in one run of the machine:

    .venv/bin/python bench/acceptburst.py --k 200 --out new.json
    PYTHONPATH=/tmp/old .venv/bin/python bench/acceptburst.py --k 200 --out old.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

if "PYTHONPATH" not in os.environ:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipexctl.discovery.discovery import Discovery  # noqa: E402
from pipexctl.kernel.backend import NullBackend  # noqa: E402
from pipexctl.offload.datapath import NullDataPath  # noqa: E402
from pipexctl.offload.server import OffloadServer  # noqa: E402

CLIENT = r"""
import json, selectors, socket, sys, time
path, k, gap = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
sel = selectors.DefaultSelector()
ms, bufs, t0 = [None] * k, {}, time.monotonic()
i = left = 0
while i < k or left:
    due = t0 + i * gap
    if i < k and time.monotonic() >= due:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        started = time.monotonic_ns()
        s.connect(path)
        s.sendall(b'{"op": "status"}\n')
        sel.register(s, selectors.EVENT_READ, (i, started))
        bufs[i], i, left = b"", i + 1, left + 1
        continue
    for key, _ in sel.select(max(0.0, due - time.monotonic()) if i < k else 30):
        n, started = key.data
        chunk = key.fileobj.recv(65536)
        bufs[n] += chunk
        if chunk and b"\n" not in bufs[n]:
            continue
        if bufs[n].startswith(b'{"ok": true'):
            ms[n] = (time.monotonic_ns() - started) / 1e6
        sel.unregister(key.fileobj)
        key.fileobj.close()
        left -= 1
print(json.dumps(ms))
"""


def pct(v: list[float], q: float) -> float:
    v = sorted(v)
    return round(v[max(0, math.ceil(q * len(v)) - 1)], 1)


def burner(stop: threading.Event, busy: float, every: float) -> None:
    while not stop.is_set():
        end = time.monotonic() + busy
        while time.monotonic() < end:  # pure Python: holds the lock but for the forced switches
            pass
        stop.wait(max(0.0, every - busy))


def one(k: int, gap_ms: float, busy_ms: float, every_ms: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        srv = OffloadServer(os.path.join(tmp, "s.sock"), Discovery([], proc=False, kernel=False), NullBackend(),
                            NullDataPath())
        t = threading.Thread(target=srv.serve_forever, daemon=True)
        t.start()
        while not os.path.exists(srv.socket_path):
            time.sleep(0.01)
        stop = threading.Event()
        if busy_ms:
            threading.Thread(target=burner, args=(stop, busy_ms / 1000, every_ms / 1000), daemon=True).start()
        time.sleep(0.5)  # the request threads started ahead, where the code has them
        try:
            out = subprocess.run([sys.executable, "-c", CLIENT, srv.socket_path, str(k), str(gap_ms / 1000)],
                                 capture_output=True, text=True, check=True, timeout=300)
        finally:
            stop.set()
            srv.stop.set()
            t.join(10)
    ms = json.loads(out.stdout)
    ok = [x for x in ms if x is not None]
    if not ok:
        raise SystemExit(f"no request answered: {ms[:5]}")
    return {"k": k, "gap_ms": gap_ms, "busy_ms": busy_ms, "every_ms": every_ms, "answered": len(ok),
            "p50_ms": pct(ok, .5), "p90_ms": pct(ok, .9), "p99_ms": pct(ok, .99), "max_ms": round(max(ok), 1)}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--k", type=int, default=200)
    p.add_argument("--gap", type=float, default=2.0, help="ms between the connections")
    p.add_argument("--busy", default="0,50", help="comma-separated ms the stand-in poll holds the lock per burst")
    p.add_argument("--every", type=float, default=100.0, help="ms from one burst's start to the next")
    p.add_argument("--out", default="")
    a = p.parse_args()
    rows = []
    for busy in (float(x) for x in a.busy.split(",")):
        r = one(a.k, a.gap, busy, a.every)
        print(json.dumps(r), flush=True)
        rows.append(r)
    if a.out:
        Path(a.out).write_text(json.dumps({"rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
