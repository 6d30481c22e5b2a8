"""A CPU sampler for `pipexctl serve`, loaded as ``sitecustomize`` when this
directory is on PYTHONPATH (bench/loginstorm.py --profile-cpu puts it
there).  Not part of the product; the daemon does not know it is there.

Every PIPEXCTL_SAMPLE_INTERVAL seconds (default 0.1) each thread's CPU time
since the last sample (/proc/self/task/TID/schedstat, ns) is charged to the
Python stack it is in at that moment, and the totals are written as
collapsed stacks ("thread;frame;frame ns" lines, flame-graph input) to
PIPEXCTL_SAMPLE_OUT every 3 s.  CPU a thread spent between two samples is
charged where the second one finds it, so short pieces of work land on the
wait that follows them (a `select` leaf); the sampler's own CPU is in the
first line.  py-spy fell tens of seconds behind on the TCG guest, hence this.
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import time


def _cpu_ns(tid: int) -> int | None:
    try:
        with open(f"/proc/self/task/{tid}/schedstat", "rb") as f:
            return int(f.read().split()[0])
    except OSError:
        return None


def _start() -> None:
    out = os.environ.get("PIPEXCTL_SAMPLE_OUT")
    try:
        with open("/proc/self/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return
    if not out or b"pipexctl" not in argv or b"serve" not in argv:
        return  # only the daemon (its children and the bench itself inherit the variables)
    interval = float(os.environ.get("PIPEXCTL_SAMPLE_INTERVAL", "0.1"))
    weights: collections.Counter[str] = collections.Counter()
    last: dict[int, int] = {}

    def loop() -> None:
        me = threading.get_native_id()
        samples, dumped = 0, time.monotonic()
        while True:
            time.sleep(interval)
            frames = sys._current_frames()
            for th in threading.enumerate():
                tid = th.native_id
                if tid is None or tid == me:
                    continue
                now = _cpu_ns(tid)
                if now is None:
                    continue
                spent, last[tid] = now - last.get(tid, 0), now
                f = frames.get(th.ident) if th.ident is not None else None
                if spent <= 0 or f is None:
                    continue
                stack = []
                while f is not None:
                    stack.append(f"{f.f_code.co_name} ({os.path.basename(f.f_code.co_filename)}:{f.f_lineno})")
                    f = f.f_back
                weights[th.name.split(" ")[0].split("-")[0] + ";" + ";".join(reversed(stack))] += spent
            samples += 1
            if time.monotonic() - dumped > 3:
                dumped = time.monotonic()
                with open(out + ".tmp", "w") as fh:
                    fh.write(f"# samples {samples} sampler_cpu_ns {_cpu_ns(me) or 0}\n")
                    fh.writelines(f"{k} {v}\n" for k, v in weights.items())
                os.replace(out + ".tmp", out)

    threading.Thread(target=loop, name="cpusampler", daemon=True).start()


_start()
