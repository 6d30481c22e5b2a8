"""The netlink send/receive loop of L2tpNetlink, against the host kernel's
own generic-netlink controller (every Linux has it; the host has no l2tp
family, which is the other half of what is checked here)."""

from __future__ import annotations

import pytest

from pipexctl import errors
from pipexctl.kernel import netlink as n


def _families(nl: n.L2tpNetlink) -> list[str]:
    m = n.ctrlmsg()
    m["cmd"] = n.CTRL_CMD_GETFAMILY
    m["version"] = 1
    m["attrs"] = []
    return [x.get_attr("CTRL_ATTR_FAMILY_NAME") for x in
            nl._exchange(m, n.GENL_ID_CTRL, n.NLM_F_REQUEST | n.NLM_F_DUMP, n.ctrlmsg)]


def test_resolves_a_family_and_dumps_to_the_end():
    with n.L2tpNetlink("nlctrl") as nl:
        assert nl.family == n.GENL_ID_CTRL
        names = _families(nl)
        assert "nlctrl" in names and len(names) == len(set(names))
        assert _families(nl) == names  # the socket is reusable after a dump


def test_an_answer_of_an_earlier_request_is_skipped():
    with n.L2tpNetlink("nlctrl") as nl:
        m = n.ctrlmsg()
        m["cmd"] = n.CTRL_CMD_GETFAMILY
        m["version"] = 1
        m["attrs"] = [["CTRL_ATTR_FAMILY_NAME", "nlctrl"]]
        m["header"].update(type=n.GENL_ID_CTRL, flags=n.NLM_F_REQUEST | n.NLM_F_ACK, sequence_number=999999, pid=0)
        m.encode()
        nl._sock.send(m.data)  # answered, never read: the next request must not take it for its own
        assert "nlctrl" in _families(nl)


def test_an_error_answer_raises_with_its_errno():
    with n.L2tpNetlink("nlctrl") as nl:
        with pytest.raises(errors.KernelSupportError, match="family 'nosuch' not found"):
            nl._resolve("nosuch")  # ENOENT
        with pytest.raises(errors.InvalidArgumentError):
            nl._resolve("x" * 40)  # EINVAL: longer than GENL_NAMSIZ
        assert nl._resolve("nlctrl") == n.GENL_ID_CTRL  # and the socket still answers


def test_missing_family_is_one_clear_error_and_leaks_no_socket():
    import os

    before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(errors.KernelSupportError, match="not found"):
        n.L2tpNetlink("nosuch")
    assert len(os.listdir("/proc/self/fd")) == before


def test_the_codec_loads_without_pyroute2s_whole_api_and_the_api_still_works():
    import subprocess
    import sys

    code = ("import sys, pipexctl.kernel.netlink\n"
            "print(sorted(m for m in sys.modules if m.startswith('pyroute2')))\n"
            "from pyroute2 import IPRoute, NDB\n"
            "import pyroute2\n"
            "print('pyroute2.ndb' in sys.modules, pyroute2.__version__ != 'unknown')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0] == "['pyroute2', 'pyroute2.common', 'pyroute2.netlink', 'pyroute2.netlink.exceptions']"
    assert out[1] == "True True"  # a later `from pyroute2 import ...` ran the real __init__
