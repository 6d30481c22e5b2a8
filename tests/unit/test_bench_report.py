"""The bench's markdown report (bench/run.py): ratios and the kernel's share
are computed from the figures, never written in."""

from __future__ import annotations

import importlib.util
import json
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
    assert "- d / b (target >= 15): 15.20" in md
    assert "- d / c (target >= 0.95): 0.95" in md
    assert "- c / a (target >= 0.7): 0.80" in md


def test_variant_ratios_and_the_scale_table_come_from_the_medians():
    run = _run_module()
    f = lambda *x: {"forward": list(x), "reverse": [1.0]}  # noqa: E731
    res = {"kernel": "6.1", "cpus": 2, "seconds": 10, "cases": {
        "d-pipexctl": f(200.0), "b-xl2tpd-pty-stock": f(20.0, 30.0, 40.0), "d-pipexctl-stock": f(300.0),
        "b-xl2tpd-pty-esp": f(10.0), "c-xl2tpd-kernel-esp": f(80.0), "d-pipexctl-esp": f(76.0)},
        "scale": {"d-pipexctl/sessions": {"0": {"median": 400.0}, "10000": {"median": 380.0}},
                  "c-xl2tpd-kernel/tunnels": {"0": {"median": 400.0}, "10000": {"median": 50.0}},
                  "d-pipexctl/tunnels": {"0": {"median": 420.0}, "10000": {"median": 55.0}}}}
    md = run.table(res)
    assert "- stock options: d / b (target >= 10): 10.00" in md
    assert "- stock options: d / d with the lab's options: 1.50" in md
    assert "- under ESP: d / c (target >= 0.95): 0.95" in md and "- under ESP: d / b (target >= 4): 7.60" in md
    sc = run.scale_table(res)
    assert "| 10,000 | - | 380.0 | 50.0 | 55.0 |" in sc
    assert "N = 10,000 / N = 0 (target >= 0.9): 0.95" in sc
    assert "0: 1.05, 10,000: 1.10" in sc


def test_scale_passes_and_serve_cpu_are_shown_per_n():
    run = _run_module()
    res = {"scale": {"d-pipexctl/sessions": {"0": {"median": 400.0, "passes": [390.0, 410.0],
                                                   "serve_cpu_seconds": [0.25, 0.5]}},
                     "c-xl2tpd-kernel/tunnels": {"0": {"median": 300.0, "passes": [310.0, 290.0]}}}}
    sc = run.scale_table(res)
    assert "| 0 | - | 390.0 / 410.0 | 310.0 / 290.0 | - | 0.2 + 0.5 / - |" in sc


def test_merged_passes_take_the_median_of_every_run():
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("bench_dp", ROOT / "bench" / "dataplane.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_dp"] = mod
    spec.loader.exec_module(mod)
    got = mod.merge_passes([{"0": {"forward": [1.0, 2.0, 3.0], "median": 2.0, "build_seconds": 0.1,
                                   "serve_cpu_seconds": 0.0}},
                            {"0": {"forward": [10.0, 20.0, 30.0], "median": 20.0, "build_seconds": 0.2,
                                   "serve_cpu_seconds": 0.5}, "error": "boom"}])
    assert got["0"]["median"] == 6.5 and got["0"]["passes"] == [2.0, 20.0] and got["error"] == "boom"


def test_the_login_storm_rows_compare_time_to_all_offloaded_with_kernel_modes_all_up():
    run = _run_module()
    st = {"rows": [{"k": 100, "case": "c-xl2tpd-kernel", "all_up_seconds": 40.0},
                   {"k": 100, "case": "d-pipexctl", "all_offloaded_seconds": 44.0,
                    "channel_latency_ms": {"n": 100, "p50": 50.0, "p99": 90.4, "max": 120.0}},
                   {"k": 150, "case": "c-xl2tpd-kernel", "error": "TimeoutError: x"}]}
    md = run.storm_table(st)
    assert "| 100 | 40.0 | 44.0 | 1.10 | 50 / 90 / 120 (100) |" in md
    assert "| 150 | TimeoutError: x | not all up | - | 0 / 0 / 0 (0) |" in md


def test_a_storm_round_that_lost_calls_says_how_long_the_others_took():
    # up_at / offloaded_at: when each count of calls was reached; a call counts once up and offloaded
    st = {"rows": [{"k": 3, "case": "c-xl2tpd-kernel", "all_up_seconds": None, "links_up": 2, "up_at": [5.0, 9.5]},
                   {"k": 3, "case": "d-pipexctl", "all_offloaded_seconds": None, "links_up": 2,
                    "up_at": [4.0, 8.0], "offloaded_at": [4.5, 7.0]}]}
    md = _run_module().storm_table(st)
    assert "| 3 | not all up: 2 of 3, 2 by 9.5 | not all up: 2 of 3, 2 by 8.0 | - |" in md
    st["rows"][1]["tunnel_id_clashes"] = 1
    assert "not all up: 2 of 3, 2 by 8.0 (1 tunnel id clash in xl2tpd) | - |" in _run_module().storm_table(st)


def test_the_bookkeeping_rows_show_each_operation_per_n_and_code():
    md = _run_module().bookkeeping_table({"rows": [
        {"layout": "own-tunnel", "n": 10000, "code": "abc1234", "offload_ms": {"p50": 175.9},
         "under_lock_ms": {"p50": 138.3}, "end_ms": {"p50": 164.5}},
        {"layout": "own-tunnel", "n": 10000, "code": "this tree", "offload_ms": {"p50": 10.1},
         "under_lock_ms": {"p50": 1.0}, "end_ms": {"p50": 9.7}, "request_lookup_ms": {"p50": 0.09}}]})
    assert "| own-tunnel | 10,000 | abc1234 | 175.90 | 138.30 | 164.50 | - |" in md
    assert "| own-tunnel | 10,000 | this tree | 10.10 | 1.00 | 9.70 | 0.090 |" in md
    assert _run_module().bookkeeping_table({}) == ""


def test_the_live_move_rows_show_each_runs_ratio_and_a_failed_run_as_failed():
    run = _run_module()
    lm = {"runs": [{"moved": True, "moved_after_serving_s": 1.3, "pty_mbps": 17.6, "kernel_mbps": 479.2,
                    "ratio": 27.2, "zero_intervals": 0},
                   {"moved": False, "moved_after_serving_s": 60.0, "zero_intervals": 3},
                   {"error": "RuntimeError: pipexctl serve did not start"}]}
    md = run.livemove_table(lm)
    assert "| 1 | 1.30 | 17.6 | 479.2 | 27.2 | 0 |" in md
    assert "| 2 | failed: not moved within 60 s |" in md
    assert "| 3 | failed: RuntimeError: pipexctl serve did not start |" in md
    assert run.livemove_table({}) == ""


def test_request_split_rows_and_the_dump_split_line():
    run = _run_module()

    def op(lib_us, floor_us):
        return {"library": {"median_us": lib_us}, "floor": {"median_us": floor_us},
                "overhead_per_kernel": round((lib_us - floor_us) / floor_us, 2)}

    cp = {"request_split": {"sessions": 500, "create": op(600.0, 300.0), "get": op(900.0, 300.0),
                            "delete": op(800.0, 400.0)},
          "dump_split": {"sessions": 10000, "models": {"median_s": 67.0}, "counters": {"median_s": 4.5},
                         "ids": {"median_s": 3.6}, "floor": {"median_s": 2.7}}}
    md = run.cp_table(cp)
    assert "| session create | 600 | 300 | 1.00 |" in md
    assert "| session get | 900 | 300 | 2.00 |" in md
    assert "a dump of 10,000 sessions, median s: models 67.00, counters 4.50, ids 3.60, floor 2.70" in md


def test_the_cpu_sampler_charges_a_daemons_cpu_to_its_stacks_and_nothing_else(tmp_path):
    """bench/cpusampler (loginstorm --profile-cpu) writes collapsed stacks
    for a process run as `... pipexctl serve`, and stays out of any other."""
    import os
    import subprocess
    import sys

    code = ("import time\n"
            "def spin():\n"
            "    end = time.thread_time() + 1.0\n"
            "    while time.thread_time() < end:\n"
            "        pass\n"
            "spin()\ntime.sleep(3.5)\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "bench" / "cpusampler"), "PIPEXCTL_SAMPLE_INTERVAL": "0.05"}
    env["PIPEXCTL_SAMPLE_OUT"] = str(tmp_path / "serve.txt")
    subprocess.run([sys.executable, "-c", code, "pipexctl", "serve"], env=env, check=True)
    lines = (tmp_path / "serve.txt").read_text().splitlines()
    assert lines[0].startswith("# samples ")
    spun = sum(int(ln.rpartition(" ")[2]) for ln in lines[1:] if ";spin (<string>" in ln)
    assert 0.7e9 < spun < 1.3e9, lines
    threads = "import threading; print(sorted(t.name for t in threading.enumerate()))"
    for argv, sampled in ((["pipexctl", "status"], False), (["pipexctl", "serve"], True)):
        out = subprocess.run([sys.executable, "-c", threads, *argv], env=env, check=True, capture_output=True, text=True)
        assert ("cpusampler" in out.stdout) == sampled, (argv, out.stdout)


def _module(name):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _offload_line(at, total, line_wait, pppd=None, before=None, loop=None):
    tail = ("; as pppd saw it %d ms (ms: its wake for our reply %d, its checks %d, our read of its ack %d%s)"
            % (*pppd[:4], ", its own wait for a CPU %d" % pppd[4] if len(pppd) > 4 else "") if pppd else "")
    tail += ("; before our clock %d ms (ms: until our accept %d, its thread %d, the request read %d, "
             "its pppd proven %d)" % before if before else "")
    tail += "; our accept loop woke %d ms after the ask, having waited %d ms for a CPU" % loop if loop else ""
    return (f"{at} pipexctl serve: call 1 (tunnel 2) of pppd 3 offloaded in {total} ms (ms: discovery {line_wait + 1}, "
            f"of it the call's line {line_wait}, lock 0, kernel 5, of it on a CPU 3 and waiting for one 2, state file 1, "
            f"hand-off {total - line_wait - 7}){tail}\n")


def test_storm_records_are_kept_and_read_back_into_the_figures_the_docs_quote(tmp_path):
    """A boot's rounds (one directory each, as run.sh leaves them) are kept in
    the record layout; the table computes ratios against kernel mode's mean
    and pools the daemon's own request lines, and counts the long line waits
    that fell inside a logged full poll."""
    sr = _module("stormrecords")
    src = tmp_path / "boot"

    def round_dir(name, row, log=None):
        d = src / name
        (d / "storm-153-x").mkdir(parents=True)
        (d / "storm.json").write_text(json.dumps({"rows": [row]}))
        if log is not None:
            (d / "storm-153-x" / "lns-serve.log").write_text(log)

    round_dir("a-c-153-1", {"all_up_seconds": 80.0, "links_up": 153})
    round_dir("a-c-153-2", {"all_up_seconds": 100.0, "links_up": 153})
    # 20 requests: one waited 300 ms for its line while a 1.5 s full poll ran, one 200 ms outside any poll
    log = "2026-12-06T10:00:00.000 pipexctl serve: serving on /run/x\n"
    log += "2026-12-06T10:00:11.500 pipexctl serve: slow discovery poll: 1500 ms, 300 ms of CPU (full=True; ms: scan 1)\n"
    log += _offload_line("2026-12-06T10:00:10.800", 400, 300, (450, 80, 2, 1, 300),  # a plugin that stamps its ack
                         (130, 100, 10, 5, 15), (90, 20))
    log += _offload_line("2026-12-06T10:00:20.500", 250, 200)
    # a poll that is not full, and one that ended just before the next request's wait began: neither counts
    log += "2026-12-06T10:00:21.000 pipexctl serve: slow discovery poll: 3000 ms, 1 ms of CPU (full=False; ms: logs 1)\n"
    log += "2026-12-06T10:00:29.900 pipexctl serve: slow discovery poll: 1200 ms, 300 ms of CPU (full=True; ms: scan 1)\n"
    log += "".join(_offload_line(f"2026-12-06T10:00:{30 + i}.000", 20 + i, i, (25, 5, 1, 1) if i == 0 else None)
                   for i in range(18))
    round_dir("b-d-153-1", {"all_offloaded_seconds": 108.0, "links_up": 153, "objects": {"pppol2tp_sessions": 153},
                            "channel_latency_ms": {"n": 20, "p50": 30.4, "p99": 399.6},
                            "stats": {"control_questions": 9, "control_questions_ahead": 8},
                            "cpu_seconds": {"serve": 20.5}}, log)
    (src / "b-d-153-2").mkdir()  # a round that never ended: nothing to keep
    dst = tmp_path / "records"
    assert sr.keep(src, dst) == ["a-c-153-1", "a-c-153-2", "b-d-153-1"]
    assert sorted(p.name for p in dst.iterdir()) == ["a-c-153-1.json", "a-c-153-2.json", "b-d-153-1-lns-serve.log.gz",
                                                     "b-d-153-1.json"]
    t = sr.table(dst)
    assert t["kernel_mode_mean"] == {153: 90.0}
    b = next(r for r in t["rounds"] if r["round"] == "b-d-153-1")
    assert (b["seconds"], b["ratio"], b["request_p50_p99_ms"], b["daemon_cpu_s"]) == (108.0, 1.2, [30, 400], 20.5)
    c = t["codes"]["b K=153"]
    assert c["requests"] == 20 and c["request_p50_p90_p99_ms"] == [30, 58, 372]
    assert c["line_wait_p50_p90_p99_ms"] == [10, 35, 281] and c["line_waits_over_20_ms"] == 2
    assert c["slowest_5_percent_mean_ms"]["request"] == 400 and c["slowest_5_percent_mean_ms"]["hand-off"] == 93
    assert (c["line_waits_over_100_ms"], c["of_them_during_a_full_poll"]) == (2, 1)
    assert (c["other_requests"], c["others_during_a_full_poll"]) == (18, 0)
    # the two stamped requests: as pppd saw them, and less pppd's own wake and checks (400 - 80 - 2, 20 - 5 - 1)
    assert c["stamped_requests"] == 2 and c["as_pppd_saw_p50_p90_p99_ms"] == [238, 408, 446]
    assert c["less_pppds_wake_and_checks_p50_p90_p99_ms"] == [166, 288, 315]
    s5 = c["slowest_5_percent_of_stamped_mean_ms"]
    assert (s5["request"], s5["hand-off"], s5["as pppd saw it"], s5["its wake for our reply"]) == (400, 93, 450, 80)
    # pppd's own wait for a CPU, sent by one of them: 300 of its 450 ms
    assert c["pppds_own_cpu_wait_p50_p90_p99_ms"] == [300, 300, 300]
    assert c["as_pppd_saw_less_its_cpu_wait_p50_p90_p99_ms"] == [150, 150, 150]
    # the steps before the daemon's clock, logged for one of them
    assert c["before_our_clock_p50_p90_p99_ms"] == [130, 130, 130]
    s5 = c["slowest_5_percent_as_pppd_saw_mean_ms"]
    assert (s5["as pppd saw it"], s5["before our clock"], s5["until our accept"], s5["its pppd proven"]) == \
        (450, 130, 100, 15)
    # the accept loop's wake, logged for that one: 90 ms of its 100 until the accept, 20 of them waiting for a CPU
    assert c["until_our_accept_p50_p90_p99_ms"] == [100, 100, 100]
    assert c["accept_loop_woke_p50_p90_p99_ms"] == [90, 90, 90]
    assert c["accept_loop_cpu_wait_p50_p90_p99_ms"] == [20, 20, 20]
    assert c["accept_loop_woke_less_cpu_wait_p50_p90_p99_ms"] == [70, 70, 70]
    assert list(t["codes"]) == ["b K=153"]  # kernel mode has no daemon
    assert "ratio=1.2" in sr.render(dst, t)
