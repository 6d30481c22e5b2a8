"""pipexctl.testing.probe: the independent probes the kernel tests read."""

import pytest

from pipexctl.testing import probe


def test_ip_json_parses_the_host_links():
    links = probe.ip_json(None, "link", "show")
    assert any(i["ifname"] == "lo" for i in links)


def test_ip_json_names_the_command_when_ip_fails():
    with pytest.raises(probe.ProbeError, match="link show no-such-dev"):
        probe.ip_json(None, "link", "show", "no-such-dev")


def test_an_interrupted_dump_is_taken_again(monkeypatch):
    """The CI failure of stop 9: iproute2 printed a valid JSON document and
    then 'Dump was interrupted' and the test parsed it; now it is retaken."""
    import subprocess

    outs = iter([
        subprocess.CompletedProcess([], 0, '[{"ifname":"ppp0"}]\n', "Dump was interrupted and may be inconsistent.\n"),
        subprocess.CompletedProcess([], 0, '[{"ifname":"ppp0"},{"ifname":"ppp1"}]\n', ""),
    ])
    monkeypatch.setattr(probe.subprocess, "run", lambda *a, **k: next(outs))
    assert [i["ifname"] for i in probe.ip_json("ns", "link", "show")] == ["ppp0", "ppp1"]


def test_a_dump_interrupted_every_time_is_an_error(monkeypatch):
    import subprocess

    monkeypatch.setattr(probe.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(
        [], 0, "[]", "Dump was interrupted and may be inconsistent.\n"))
    monkeypatch.setattr(probe.time, "sleep", lambda s: None)
    with pytest.raises(probe.ProbeError, match="interrupted dump 3 times"):
        probe.ip_json("ns", "addr", "show", tries=3)


def test_wait_until_names_what_it_waited_for():
    with pytest.raises(AssertionError, match="waiting for the moon; detail"):
        probe.wait_until(lambda: False, "the moon", timeout=0.2, detail=lambda: "; detail")
    probe.wait_until(lambda: True, "nothing", timeout=0.2)


def test_ppp_peer_addrs_and_links_read_only_ppp_links_with_ipv4(monkeypatch):
    dump = [{"ifname": "lo", "addr_info": [{"family": "inet", "address": "127.0.0.1"}]},
            {"ifname": "ppp0", "addr_info": [{"family": "inet", "local": "10.99.100.1", "address": "10.99.100.2"}]},
            {"ifname": "ppp1", "addr_info": [{"family": "inet6", "address": "fe80::1"}]},
            {"ifname": "ppp2", "addr_info": []}]
    monkeypatch.setattr(probe, "ip_json", lambda ns, *a: dump)
    assert probe.ppp_peer_addrs("ns") == {"ppp0": "10.99.100.2"}
    assert probe.ppp_inet_links("ns") == ["ppp0"]


def test_memory_kib_reads_the_status_figures_of_a_process():
    import os
    import threading

    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        mine, by_pid = probe.memory_kib(), probe.memory_kib(os.getpid())
    finally:
        stop.set()
        t.join()
    assert 0 < mine["RssAnon"] < mine["VmRSS"] <= mine["VmHWM"] and mine["Threads"] >= 2
    assert by_pid["Threads"] == mine["Threads"] and "Name" not in mine


def test_the_lab_redials_once_a_call_xl2tpd_gave_remote_call_id_0(tmp_path, capsys):
    """The CI failure of stop 45: xl2tpd's LAC took a remote call id of 0
    after a redial and the LNS refused its ICCN.  Lab.connect redials once;
    here a fake xl2tpd reads the control pipe and writes its log."""
    import os
    import select
    import threading
    import time

    from pipexctl.testing.lab import Instance, Lab

    lac = Instance("lac1", "ns", "lac", tmp_path, "10.99.1.2")
    os.mkfifo(lac.control)
    lac.log.write_bytes(b"")
    remotes = iter(["0", "4242"])
    requests = []

    fd = os.open(lac.control, os.O_RDWR)  # held open, as xl2tpd holds its pipe

    closed = threading.Event()  # the broken call's tunnel closed
    early: list[bool] = []
    close = "xl2tpd[1]: control_finish: Connection closed to 10.99.1.1, port 1701 (), Local: {}, Remote: 9\n"

    def fake_xl2tpd():
        for n in range(2):
            requests.append((os.read(fd, 100), closed.is_set()))
            with open(lac.log, "a") as log:
                if n == 0:  # an earlier tunnel's close comes in first: not the one to wait for
                    log.write(close.format(2))
                log.write(f"xl2tpd[1]: Call established with 10.99.1.1, Local: 7, Remote: {next(remotes)}, Serial: 1\n")
            if n == 0:
                time.sleep(0.5)
                early.append(bool(select.select([fd], [], [], 0)[0]))  # a redial before the close?
                closed.set()
                with open(lac.log, "a") as log:
                    log.write(close.format(3))

    t = threading.Thread(target=fake_xl2tpd, daemon=True)
    t.start()
    Lab(kernel_mode=False).connect(lac, timeout=10)
    t.join(5)
    os.close(fd)
    assert requests == [(b"c lns\n", False), (b"c lns\n", True)] and early == [False]  # redialled after the close
    assert "redialling once" in capsys.readouterr().err


def test_the_allocators_figures_follow_what_is_allocated():
    """pymalloc_mib reads the interpreter's own report: objects made show
    as bytes in use, inside the arenas counted."""
    from pipexctl.testing.probe import pymalloc_mib

    before = pymalloc_mib()
    held = [object() for _ in range(200_000)]  # 16 bytes each in the small-object heap
    during = pymalloc_mib()
    assert during["in_use_mib"] >= before["in_use_mib"] + 2.5
    assert during["arenas_mib"] >= during["in_use_mib"] > 0 and during["unused_mib"] >= 0
    del held
