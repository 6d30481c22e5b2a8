"""`pipexctl check --offload`: is this host set up for the offload?

Beside the kernel checks (kernel/check.py): the plugin in the running pppd's
plugin directory and built for that version, the daemon answering on its
socket, the options files of xl2tpd.conf loading the plugin, and each
xl2tpd's mode as the daemon sees it.  Warnings, not failures: a host can be
half set up on purpose (the plugin block added last).
"""

from __future__ import annotations

import os
import re
import subprocess

from .. import errors
from ..kernel.check import Check
from . import pppopts
from .client import ask


def _pppd_version() -> str:
    try:
        out = subprocess.run(["pppd", "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    m = re.search(r"\b(\d+\.\d+\.\d+)\b", out.stdout + out.stderr)
    return m.group(1) if m else ""


def offload_checks(xl2tpd_conf: str, socket_path: str) -> list[Check]:
    out = []
    ver = _pppd_version()
    plugin = f"/usr/lib/pppd/{ver}/pipexctl.so"
    if not ver:
        out.append(Check("pppd", False, "pppd not found (apt install ppp)", required=False))
    elif not os.path.exists(plugin):
        out.append(Check("plugin", False, f"{plugin} missing (make -C plugins install, or the .deb)", required=False))
    else:
        # pppd loads only a plugin whose pppd_version string is its own version
        with open(plugin, "rb") as f:
            built_for = b"\0" + ver.encode() + b"\0" in f.read()
        out.append(Check("plugin", built_for, f"{plugin}" + ("" if built_for else
                                                         f": not built for pppd {ver} (rebuild it)"), required=False))
    try:
        st = ask(socket_path, {"op": "status"}, timeout=5)
        n = sum(len(t["sessions"]) for t in st.get("tunnels", []))
        out.append(Check("daemon", True, f"pipexctl serve answers on {socket_path}: {n} call(s) offloaded",
                         required=False))
        for i in st.get("instances", []):
            out.append(Check(f"xl2tpd {i['instance']}", i["mode"] != "kernel",
                             f"pid {i['pid']}, {i['mode']} mode" + (": its calls are in the kernel already, "
                                                                    "nothing to offload" if i["mode"] == "kernel" else ""),
                             required=False))
    except errors.PipexError as e:
        out.append(Check("daemon", False, f"{e} (systemctl enable --now pipexctl.socket pipexctl.service)",
                         required=False))
    try:
        for path in pppopts.files_of(xl2tpd_conf):
            try:
                with open(path) as f:
                    loaded = pppopts.current(f.read()) is not None
            except OSError as e:
                out.append(Check(f"options {path}", False, f"cannot read: {e.strerror}", required=False))
                continue
            out.append(Check(f"options {path}", loaded, "loads the plugin" if loaded else
                             "does not load the plugin (pipexctl offload enable)", required=False))
    except errors.PipexError as e:
        out.append(Check("xl2tpd.conf", False, str(e), required=False))
    return out
