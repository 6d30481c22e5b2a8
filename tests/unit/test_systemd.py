"""The systemd unit passes `systemd-analyze verify` and keeps what serve needs."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _units(tmp_path):
    exe = shutil.which("systemd-analyze")
    assert exe, "systemd-analyze missing (Debian: systemd)"
    pipexctl = Path(sys.executable).with_name("pipexctl")
    assert pipexctl.exists()
    for name in ("pipexctl.service", "pipexctl.socket"):
        (tmp_path / name).write_text((ROOT / "systemd" / name).read_text()
                                     .replace("/opt/pipexctl/venv/bin/pipexctl", str(pipexctl)))
    return exe, tmp_path / "pipexctl.service", tmp_path / "pipexctl.socket"


def test_units_verify(tmp_path):
    exe, service, sock = _units(tmp_path)
    r = subprocess.run([exe, "verify", str(sock), str(service)], capture_output=True, text=True)
    assert r.returncode == 0 and not r.stderr.strip(), r.stderr


def test_security_exposure_is_at_most_3(tmp_path):
    exe, service, _ = _units(tmp_path)
    r = subprocess.run([exe, "security", "--offline=yes", str(service)], capture_output=True, text=True)
    m = re.search(r"Overall exposure level for pipexctl.service: (\d+\.\d)", r.stdout + r.stderr)
    assert m, r.stdout + r.stderr
    assert float(m[1]) <= 3.0, r.stdout[-3000:]


def test_unit_keeps_state_across_restarts_and_the_needed_capabilities():
    text = (ROOT / "systemd" / "pipexctl.service").read_text()
    assert "RuntimeDirectoryPreserve=yes" in text  # state.json survives a restart: adoption
    assert "CAP_NET_ADMIN" in text and "CAP_NET_RAW" in text and "CAP_SYS_PTRACE" in text
    # control-pipe reply FIFOs live in the runtime directory (control.py), so /tmp can be private
    assert "PrivateTmp=yes" in text and "RuntimeDirectory=pipexctl" in text
    assert "Type=notify" in text and "WatchdogSec=" in text and "LimitNOFILE=65536" in text
    sock = (ROOT / "systemd" / "pipexctl.socket").read_text()
    assert "ListenStream=/run/pipexctl/serve.sock" in sock and "SocketMode=0600" in sock
    assert "Requires=pipexctl.socket" in text
    mods = (ROOT / "systemd" / "pipexctl-modules.conf").read_text().split()
    assert {"l2tp_ppp", "l2tp_netlink", "l2tp_eth"} <= set(mods)
