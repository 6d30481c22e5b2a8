"""The bench's markdown report (bench/run.py): ratios and the kernel's share
are computed from the figures, never written in."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run_module():
    spec = importlib.util.spec_from_file_location("bench_run", ROOT / "bench" / "run.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def lib(n, create, delete):
    return {"sessions": n, "create_s": create, "delete_s": delete, "per_op_us": (create + delete) / (2 * n) * 1e6,
            "sessions_per_s": n / (create + delete)}


def test_control_plane_table_splits_create_and_delete_and_shows_the_rcu_share():
    run = _run_module()
    cp = {"eth_vs_ip": [{"lib": lib(1000, 8.0, 40.0), "ip": lib(1000, 80.0, 160.0), "speedup": 5.0}],
          "one_tunnel": [{"lib": lib(100, 1.0, 2.0)}, {"lib": lib(1000, 9.0, 27.0)}, {"lib": lib(10000, 90.0, 270.0)}],
          "rcu_expedited": True, "as_shipped": {"rcu_expedited": "0", "lib": lib(1000, 9.0, 30.0)},
          "phase_seconds": {"eth_vs_ip": 290.0},
          "serve_rss": [{"sessions": 10000, "rss_kib": 61440}]}
    md = run.cp_table(cp)
    assert "| 1,000 | 24000 | 120000 | 5.0x | 8.0 / 40.0 | 80.0 / 160.0 |" in md
    assert "9.0 / 27.0 with /sys/kernel/rcu_expedited=1 (as in every row above), 9.0 / 30.0 as the kernel ships" in md
    assert "10,000 / at 100 sessions (target <= 1.5): 1.20" in md
    assert "eth_vs_ip 290" in md
    assert "10,000 sessions 60.0 MiB" in md


def test_data_plane_ratios_come_from_the_medians():
    run = _run_module()
    res = {"kernel": "6.1", "cpus": 2, "seconds": 10, "cases": {
        "a-veth": {"forward": [100.0, 200.0, 300.0], "reverse": [1.0]},
        "b-xl2tpd-pty": {"forward": [10.0, 10.0, 10.0], "reverse": [1.0]},
        "c-xl2tpd-kernel": {"forward": [150.0, 160.0, 170.0], "reverse": [1.0]},
        "d-pipexctl": {"forward": [150.0, 152.0, 190.0], "reverse": [1.0]}}}
    md = run.table(res)
    assert "- d / b (target >= 10): 15.20" in md
    assert "- d / c (target >= 0.95): 0.95" in md
    assert "- c / a (target >= 0.7): 0.80" in md
