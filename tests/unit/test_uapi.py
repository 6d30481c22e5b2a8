"""Constants and struct layouts against the kernel's own uapi headers.

A C program is compiled against the installed linux-libc-dev headers and
prints every constant, sizeof and offsetof; the Python side must agree.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import pytest

from pipexctl.kernel import pppol2tp, uapi

L2TP_NAMES = [n for n in dir(uapi) if n.startswith(("L2TP_CMD_", "L2TP_ATTR_", "L2TP_PWTYPE_", "L2TP_L2SPECTYPE_",
                                                     "L2TP_ENCAPTYPE_", "L2TP_SEQ_", "L2TP_MSG_"))]
OTHER_NAMES = ["AF_PPPOX", "PX_PROTO_OE", "PX_PROTO_OL2TP", "PX_PROTO_PPTP", "SOL_PPPOL2TP",
               "PPPOL2TP_SO_DEBUG", "PPPOL2TP_SO_RECVSEQ", "PPPOL2TP_SO_SENDSEQ", "PPPOL2TP_SO_LNSMODE",
               "PPPOL2TP_SO_REORDERTO", "PPPIOCGCHAN", "PPPIOCGUNIT", "PPPIOCGL2TPSTATS", "PPPIOCATTCHAN",
               "PPPIOCCONNECT", "PPPIOCNEWUNIT", "PPPIOCSNPMODE", "PPPIOCDISCONN", "PPP_IP", "NPMODE_PASS",
               "L2TP_GENL_VERSION"]

STRUCTS = {
    "sockaddr_pppol2tp": pppol2tp.sockaddr_pppol2tp,
    "sockaddr_pppol2tpin6": pppol2tp.sockaddr_pppol2tpin6,
    "sockaddr_pppol2tpv3": pppol2tp.sockaddr_pppol2tpv3,
    "sockaddr_pppol2tpv3in6": pppol2tp.sockaddr_pppol2tpv3in6,
}
INNER = {
    "pppol2tp_addr": pppol2tp.pppol2tp_addr,
    "pppol2tpin6_addr": pppol2tp.pppol2tpin6_addr,
    "pppol2tpv3_addr": pppol2tp.pppol2tpv3_addr,
    "pppol2tpv3in6_addr": pppol2tp.pppol2tpv3in6_addr,
}


@pytest.fixture(scope="module")
def c_values(tmp_path_factory):
    cc = shutil.which("gcc") or shutil.which("cc")
    assert cc, "a C compiler is needed to check the ABI (make setup installs gcc)"
    src = ["#include <stdio.h>", "#include <stddef.h>", "#include <sys/socket.h>", "#include <linux/ioctl.h>", "#include <linux/l2tp.h>",
           "#include <linux/if_pppox.h>", "#include <linux/if_pppol2tp.h>", "#include <linux/ppp-ioctl.h>",
           "#include <linux/ppp_defs.h>", "int main(void) {"]
    for n in L2TP_NAMES + OTHER_NAMES:
        src.append(f'printf("{n} %lu\\n", (unsigned long)({n}));')
    for name, cls in {**STRUCTS, **INNER, "pppol2tp_ioc_stats": pppol2tp.pppol2tp_ioc_stats}.items():
        src.append(f'printf("sizeof:{name} %zu\\n", sizeof(struct {name}));')
        for f, _ in cls._fields_:
            if f == "using_ipsec":
                continue  # a bit-field: no offsetof
            src.append(f'printf("offset:{name}.{f} %zu\\n", offsetof(struct {name}, {f}));')
    src.append('printf("L2TP_GENL_NAME_%s 0\\n", L2TP_GENL_NAME);')
    src.append("return 0; }")
    d = tmp_path_factory.mktemp("abi")
    (d / "abi.c").write_text("\n".join(src))
    subprocess.run([cc, "-o", str(d / "abi"), str(d / "abi.c")], check=True, capture_output=True)
    out = subprocess.run([str(d / "abi")], check=True, capture_output=True, text=True).stdout
    return dict(line.rsplit(" ", 1) for line in out.splitlines())


@pytest.mark.parametrize("name", L2TP_NAMES + OTHER_NAMES)
def test_constant(c_values, name):
    assert int(c_values[name]) == getattr(uapi, name)


def test_genl_name(c_values):
    assert f"L2TP_GENL_NAME_{uapi.L2TP_GENL_NAME}" in c_values


@pytest.mark.parametrize("name", list(STRUCTS) + list(INNER) + ["pppol2tp_ioc_stats"])
def test_struct_layout(c_values, name):
    cls = {**STRUCTS, **INNER, "pppol2tp_ioc_stats": pppol2tp.pppol2tp_ioc_stats}[name]
    assert ctypes.sizeof(cls) == int(c_values[f"sizeof:{name}"])
    for f, _ in cls._fields_:
        if f == "using_ipsec":
            continue
        assert getattr(cls, f).offset == int(c_values[f"offset:{name}.{f}"]), f


def test_sockaddr_bytes():
    sa = pppol2tp.build_sockaddr(version=2, tunnel_id=0x1234, session_id=0x5678, peer_tunnel_id=1,
                                 peer_session_id=2, fd=7, peer=("10.0.0.1", 1701))
    raw = bytes(sa)
    assert len(raw) == 38
    assert raw[:6] == b"\x18\x00\x01\x00\x00\x00"  # AF_PPPOX, PX_PROTO_OL2TP (packed, little-endian)
    assert raw[10:14] == b"\x07\x00\x00\x00"  # fd
    assert raw[14:16] == b"\x02\x00" and raw[16:18] == b"\x06\xa5"  # AF_INET, port 1701 big-endian
    assert raw[18:22] == bytes([10, 0, 0, 1])
    assert raw[30:38] == b"\x34\x12\x78\x56\x01\x00\x02\x00"
    v3 = pppol2tp.build_sockaddr(version=3, tunnel_id=0x10000, session_id=5, peer_tunnel_id=6, peer_session_id=7,
                                 family=6)
    assert ctypes.sizeof(v3) == 58 and v3.pppol2tp.s_tunnel == 0x10000
