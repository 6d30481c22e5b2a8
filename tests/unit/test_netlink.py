"""The netlink send/receive loop of L2tpNetlink, against the host kernel's
own generic-netlink controller (every Linux has it; the host has no l2tp
family, which is the other half of what is checked here)."""

from __future__ import annotations

import errno

import pytest

from pipexctl import errors
from pipexctl.kernel import netlink as n


def _families(nl: n.L2tpNetlink) -> list[str]:
    m = n.Request(n.CTRL_CMD_GETFAMILY, 1, b"")
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
        m = n.build_family_get("nlctrl").encode(n.GENL_ID_CTRL, n.NLM_F_REQUEST | n.NLM_F_ACK, 999999)
        nl._sock.send(m)  # answered, never read: the next request must not take it for its own
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
            "{}\n"
            "import pyroute2\n"
            "from pyroute2 import IPRoute, NDB\n"
            "print('pyroute2.ndb' in sys.modules, pyroute2.__version__ != 'unknown', IPRoute.__name__)\n")
    # pyroute2's own modules ask the package for its submodules (nlsocket: `from pyroute2 import config, netns`)
    for later in ("pass", "import pyroute2.netlink.generic", "import pyroute2.netlink.nlsocket",
                  "from pyroute2.iproute import IPRoute as I"):
        out = subprocess.run([sys.executable, "-c", code.format(later)], capture_output=True, text=True)
        assert out.returncode == 0, (later, out.stderr[-2000:])
        lines = out.stdout.splitlines()
        assert lines[0] == "['pyroute2', 'pyroute2.common', 'pyroute2.netlink', 'pyroute2.netlink.exceptions']"
        assert lines[1] == "True True IPRoute"  # a later `from pyroute2 import ...` ran the real __init__


def test_the_real_init_runs_once_when_threads_ask_at_once():
    import subprocess
    import sys

    code = ("import threading, pipexctl.kernel.netlink, pyroute2\n"
            "got, errs = [], []\n"
            "def ask():\n"
            "    try:\n"
            "        got.append(pyroute2.IPRoute.__name__)\n"
            "    except Exception as e:\n"
            "        errs.append(repr(e))\n"
            "ts = [threading.Thread(target=ask) for _ in range(8)]\n"
            "[t.start() for t in ts]; [t.join() for t in ts]\n"
            "print(got, errs)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == f"{['IPRoute'] * 8} []"


def test_a_request_interrupted_mid_answer_does_not_spoil_the_next():
    class Boom(n.ctrlmsg):
        def decode(self):
            raise KeyboardInterrupt  # e.g. Ctrl-C while a dump's answers are read

    with n.L2tpNetlink("nlctrl") as nl:
        m = n.Request(n.CTRL_CMD_GETFAMILY, 1, b"")
        with pytest.raises(KeyboardInterrupt):
            nl._exchange(m, n.GENL_ID_CTRL, n.NLM_F_REQUEST | n.NLM_F_DUMP, Boom)
        assert nl._unfinished
        names = _families(nl)  # reads what was left first
        assert "nlctrl" in names and not nl._unfinished
        assert nl._resolve("nlctrl") == n.GENL_ID_CTRL


def test_a_closed_socket_is_one_clear_error():
    nl = n.L2tpNetlink("nlctrl")
    nl.close()
    with pytest.raises(errors.KernelError, match="netlink socket"):
        nl._request(n.build_tunnel_get(1), n.NLM_F_REQUEST, "tunnel 1", "get")


def test_an_error_answer_ends_its_request(monkeypatch):
    """The kernel's error is a request's last answer: the next request
    must not wait out a drain (a second of silence) for more.  A delete's
    wait for the object to go ends in such an error every time; this was
    one second per tunnel removed, under the service's lock."""
    with n.L2tpNetlink("nlctrl") as nl:
        with pytest.raises(errors.KernelSupportError):
            nl._resolve("nosuch")  # ENOENT
        assert not nl._unfinished

        def no_drain() -> None:
            raise AssertionError("drained after a complete answer")

        monkeypatch.setattr(nl, "_drain", no_drain)
        assert nl._resolve("nlctrl") == n.GENL_ID_CTRL


def test_a_probe_takes_enoent_as_not_listed_and_any_other_error_as_an_error():
    """(The l2tp family answers ENODEV for a session or tunnel it does not
    have: tests/kernel's delete tests go through that probe.)"""
    with n.L2tpNetlink("nlctrl") as nl:
        assert nl._listed(n.build_family_get("nlctrl"), "family nlctrl")
        assert not nl._listed(n.build_family_get("nosuch"), "family nosuch")  # ENOENT
        with pytest.raises(errors.InvalidArgumentError):
            nl._listed(n.build_family_get("x" * 40), "family x")  # EINVAL is not "gone"
        assert nl._listed(n.build_family_get("nlctrl"), "family nlctrl")


def test_an_answer_longer_than_what_was_received_is_refused_not_read_past():
    class Short:
        """A socket whose one answer claims 64 bytes and brings 20 (an earlier
        answer's bytes lie in the buffer after them)."""

        def send(self, data):
            self.seq = n.NLMSG_HDR.unpack_from(data)[3]

        def recv_into(self, buf, size=0, flags=0):
            buf[:20] = n.NLMSG_HDR.pack(64, n.NLMSG_ERROR, 0, self.seq, 0) + n.ERRNO.pack(0)
            return 20

    with n.L2tpNetlink("nlctrl") as nl:
        real, nl._sock = nl._sock, Short()
        try:
            nl._buf[:64] = b"\xff" * 64
            with pytest.raises(errors.KernelError, match="family nlctrl") as e:
                nl._request(n.build_family_get("nlctrl"), n.NLM_F_REQUEST, "family nlctrl", "get")
            assert e.value.errno == errno.EBADMSG
        finally:
            nl._sock = real


def test_a_probe_takes_the_l2tp_familys_enodev_as_not_listed():
    class Answers:
        """A socket that answers every request with one errno."""

        def __init__(self, code):
            self.code = code

        def send(self, data):
            self.seq = n.NLMSG_HDR.unpack_from(data)[3]

        def recv_into(self, buf, size=0, flags=0):
            buf[:20] = n.NLMSG_HDR.pack(20, n.NLMSG_ERROR, 0, self.seq, 0) + n.ERRNO.pack(-self.code)
            return 20

    with n.L2tpNetlink("nlctrl") as nl:
        real = nl._sock
        try:
            for code in (errno.ENODEV, errno.ENOENT):
                nl._sock = Answers(code)
                assert not nl._listed(n.build_session_get(1, 2), "session 2 in tunnel 1")
            nl._sock = Answers(errno.EPERM)
            with pytest.raises(errors.PermissionDeniedError):
                nl._listed(n.build_session_get(1, 2), "session 2 in tunnel 1")
        finally:
            nl._sock = real
