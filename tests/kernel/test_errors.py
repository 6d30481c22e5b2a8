"""Error paths on the real kernel: clear message, nothing leaked."""

from __future__ import annotations

import subprocess

import pytest
from click.testing import CliRunner

from pipexctl import errors
from pipexctl.cli import AppContext, cli
from pipexctl.kernel.backend import NetlinkBackend
from pipexctl.model import Endpoint, PwType, SessionSpec, TunnelSpec

from .conftest import ip_l2tp

pytestmark = pytest.mark.kernel


def _tspec(pair, tid=100, ptid=200):
    return TunnelSpec(tunnel_id=tid, peer_tunnel_id=ptid, local=Endpoint.parse(f"{pair.A4}:5000"),
                      remote=Endpoint.parse(f"{pair.B4}:5001"))


def _sspec(tid=100, sid=10, psid=20, ifname=None):
    return SessionSpec(tunnel_id=tid, session_id=sid, peer_session_id=psid, pw_type=PwType.eth, ifname=ifname)


def test_duplicate_tunnel(pair, orch_in):
    o = orch_in(pair.a)
    o.add_tunnel(_tspec(pair))
    with pytest.raises(errors.AlreadyExistsError, match=r"^tunnel 100 already exists$"):
        o.add_tunnel(_tspec(pair))
    assert [t["tunnel_id"] for t in ip_l2tp(pair.a, "tunnel")] == [100]


def test_same_tunnel_other_parameters_is_a_conflict(pair, orch_in):
    o = orch_in(pair.a)
    o.add_tunnel(_tspec(pair))
    with pytest.raises(errors.ConflictError, match="tunnel 100 already exists with other parameters: peer tunnel id 200 != 201"):
        o.add_session(_sspec(), _tspec(pair, ptid=201))
    assert ip_l2tp(pair.a, "session") == []


def test_duplicate_session_keeps_the_first(pair, orch_in):
    o = orch_in(pair.a)
    o.add_session(_sspec(), _tspec(pair))
    with pytest.raises(errors.AlreadyExistsError, match=r"^session 10 in tunnel 100 already exists$"):
        o.add_session(_sspec(psid=99))
    assert ip_l2tp(pair.a, "session")[0]["peer_session_id"] == 20


def test_session_in_missing_tunnel(pair, orch_in):
    o = orch_in(pair.a)
    with pytest.raises(errors.NotFoundError, match="tunnel 999"):
        o.add_session(_sspec(tid=999))
    assert ip_l2tp(pair.a, "tunnel") == [] and ip_l2tp(pair.a, "session") == []


def test_failed_session_rolls_back_the_new_tunnel(pair, orch_in):
    """Interface name taken: the session fails, the tunnel made for it goes."""
    subprocess.run(["ip", "-n", pair.a, "link", "add", "pw0", "type", "dummy"], check=True)
    o = orch_in(pair.a)
    with pytest.raises(errors.ConflictError, match="interface pw0 already exists"):
        o.add_session(_sspec(ifname="pw0"), _tspec(pair))
    assert ip_l2tp(pair.a, "tunnel") == [] and ip_l2tp(pair.a, "session") == []


def test_failed_session_keeps_a_tunnel_it_did_not_create(pair, orch_in):
    subprocess.run(["ip", "-n", pair.a, "link", "add", "pw0", "type", "dummy"], check=True)
    o = orch_in(pair.a)
    o.add_tunnel(_tspec(pair))
    with pytest.raises(errors.ConflictError):
        o.add_session(_sspec(ifname="pw0"), _tspec(pair))
    assert [t["tunnel_id"] for t in ip_l2tp(pair.a, "tunnel")] == [100]


def test_cli_out_of_range_ids_are_usage_errors_and_touch_nothing(pair):
    backend = NetlinkBackend(netns=pair.a)
    runner = CliRunner()
    base = ["--peer-tunnel-id", "200", "--session-id", "10", "--peer-session-id", "20",
            "--local", f"{pair.A4}:1701", "--remote", f"{pair.B4}:1701"]
    for args, msg in (
        (["addsess", "l2tp", "--version", "2", "--pw", "ppp", "--tunnel-id", "70000", *base],
         "tunnel id 70000 out of range for L2TPv2 (1..65535)"),
        (["addsess", "l2tp", "--version", "3", "--tunnel-id", "0", *base], "tunnel id 0 out of range for L2TPv3"),
    ):
        r = runner.invoke(cli, args, obj=AppContext(lambda: backend))
        assert r.exit_code == 2, r.output
        assert msg in r.output
    assert ip_l2tp(pair.a, "tunnel") == []
    backend.close()


def test_v2_tunnel_rejects_eth_pseudowire_before_the_kernel(pair, orch_in):
    o = orch_in(pair.a)
    t = TunnelSpec(tunnel_id=7, peer_tunnel_id=8, version=2, local=Endpoint.parse(f"{pair.A4}:1701"),
                   remote=Endpoint.parse(f"{pair.B4}:1701"))
    o.add_tunnel(t)
    with pytest.raises(errors.InvalidArgumentError, match="L2TPv2 carries PPP only"):
        o.add_session(SessionSpec(tunnel_id=7, session_id=1, peer_session_id=2, pw_type=PwType.eth))
    assert ip_l2tp(pair.a, "session") == []
