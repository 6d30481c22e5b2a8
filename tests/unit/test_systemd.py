"""The systemd unit passes `systemd-analyze verify` and keeps what serve needs."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_unit_verifies(tmp_path):
    exe = shutil.which("systemd-analyze")
    assert exe, "systemd-analyze missing (Debian: systemd)"
    pipexctl = Path(sys.executable).with_name("pipexctl")
    assert pipexctl.exists()
    unit = tmp_path / "pipexctl.service"
    unit.write_text((ROOT / "systemd" / "pipexctl.service").read_text()
                    .replace("/opt/pipexctl/venv/bin/pipexctl", str(pipexctl)))
    r = subprocess.run([exe, "verify", str(unit)], capture_output=True, text=True)
    assert r.returncode == 0 and not r.stderr.strip(), r.stderr


def test_unit_keeps_state_across_restarts_and_the_needed_capabilities():
    text = (ROOT / "systemd" / "pipexctl.service").read_text()
    assert "RuntimeDirectoryPreserve=yes" in text  # state.json survives a restart: adoption
    assert "CAP_NET_ADMIN" in text and "CAP_NET_RAW" in text and "CAP_SYS_PTRACE" in text
    # control-pipe reply FIFOs live in /tmp, where xl2tpd must see them
    assert not any(ln.startswith("PrivateTmp=") for ln in text.splitlines())
    mods = (ROOT / "systemd" / "pipexctl-modules.conf").read_text().split()
    assert {"l2tp_ppp", "l2tp_netlink", "l2tp_eth"} <= set(mods)
