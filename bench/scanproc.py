"""What discovery's full /proc scan costs an LNS with N pppds (host; no
kernel): a farm named xl2tpd with N children that show an LNS pppd's
argv, scanned as the watcher scans every few seconds.  Two ways, each in a
fresh interpreter, interleaved (``--rounds``):

- ``every-argv``: every child's argv read, as the scan did until 2026-12-07
  for the pppds of offloaded calls too (their fds were already skipped);
- ``known``: the children whose calls discovery holds are read from their
  stat line alone (``procscan.scan(known=...)``), as serve asks now.

Reports the scan's time and the interpreter's peak RSS over it (VmHWM),
and RSS after it with the heap trimmed as serve trims it.  Not a test:
it asserts nothing.

    .venv/bin/python bench/scanproc.py --children 10000 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WAYS = ("every-argv", "known")


def child(way: str, farm: int, pids: list[int], scans: int) -> dict:
    import gc
    import time

    from pipexctl import entry

    entry.lean()
    import pipexctl.offload.server  # noqa: F401  # what serve imports
    from pipexctl.discovery import procscan
    from pipexctl.offload import malloc
    from pipexctl.testing.probe import memory_kib

    known = set(pids) if way == "known" else set()

    def mib(key: str) -> float:
        return round(memory_kib()[key] / 1024, 1)

    gc.collect()
    malloc.trim()
    out: dict = {"way": way, "before_rss_mib": mib("VmRSS"), "before_peak_mib": mib("VmHWM"), "scan_ms": []}
    for _ in range(scans):
        t = time.perf_counter()
        _, children = procscan.scan(parents={farm}, known=known, fds_of=lambda p: False)
        out["scan_ms"].append(round((time.perf_counter() - t) * 1000, 1))
        out["children"] = len(children.get(farm, ()))
        del children
        gc.collect()
        malloc.trim()
    out["after_rss_mib"], out["peak_mib"] = mib("VmRSS"), mib("VmHWM")
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--children", type=int, default=10000)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--scans", type=int, default=3, help="scans per interpreter")
    p.add_argument("--out", help="write the rows here as JSON")
    p.add_argument("--child", nargs=3, metavar=("WAY", "FARM", "PIDS"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        pids = [int(x) for x in Path(a.child[2]).read_text().split()]
        print(json.dumps(child(a.child[0], int(a.child[1]), pids, a.scans)))
        return 0
    sys.path.insert(0, str(ROOT / "bench"))
    from farm import pppd_farm
    from fresh import interleaved, write_rows

    with tempfile.TemporaryDirectory() as d:
        farm, pids = pppd_farm(a.children, d, as_xl2tpd=True)
        try:
            Path(d, "pids").write_text(" ".join(map(str, pids)))
            rows = interleaved(WAYS, a.rounds, lambda way: [__file__, "--scans", str(a.scans), "--child", way,
                                                            str(farm.pid), os.path.join(d, "pids")])
        finally:
            farm.kill()
            farm.wait()
    if a.out:
        write_rows(a.out, {"children": a.children}, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
