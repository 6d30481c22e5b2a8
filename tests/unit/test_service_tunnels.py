"""Which kernel tunnel an offloaded call's session goes to (service.py), on
the null kernel backend and the null data path: a duplicate refused, a
second tunnel of one address pair (a twin) steered, a second port of one
address a tunnel of its own, and ids xl2tpd reused while the old call or
tunnel was still recorded.  The service's rollback is test_service.py."""

from __future__ import annotations

import pytest

from pipexctl import errors

from .conftest import call, offload


def test_a_duplicate_offload_leaves_the_healthy_session_and_its_tunnel_socket(srv):
    offload(srv, call(1))
    tunnels = dict(srv.service.datapath.tunnels)
    with pytest.raises(errors.ConflictError):
        srv.service.offload(call(1), 4242)
    assert 1 in srv.service.tunnels[("xl2tpd", 100)].records
    assert srv.service.datapath.tunnels == tunnels and len(tunnels) == 1  # the tunnel's socket is still open
    assert srv.service.tunnels[("xl2tpd", 100)].sock.fileno() >= 0
    assert srv.service.backend.session_get(100, 1).session_id == 1


def test_a_second_tunnel_from_the_same_peer_address_and_port_gets_a_steered_socket(srv):
    """Linux before 6.11 looks a data packet's session up in the tunnel of
    the socket that received it: only the first tunnel of an address pair
    sits on xl2tpd's port, a second one (a twin) on a steered private port."""
    offload(srv, call(1))
    first = srv.service.tunnels[("xl2tpd", 100)]
    srv.service.xl2tpd_port = first.local_port  # as if the first one sat on xl2tpd's port
    offload(srv, call(5, tid=103))
    offload(srv, call(4, tid=102, peer="192.0.2.8"))  # another peer: a tunnel of its own
    assert {t: twin for t, (twin, _) in srv.service.datapath.tunnels.items()} == {100: False, 103: True, 102: False}
    assert srv.service.backend.tunnel_get(103).peer_tunnel_id == 200


def test_a_tunnel_from_a_second_port_of_one_address_goes_to_that_port_and_is_no_twin(srv):
    """Two clients behind one NAT address: the second tunnel's socket is
    connected to its own peer port, and it is not a twin (another pair)."""
    offload(srv, call(1))
    srv.service.xl2tpd_port = srv.service.tunnels[("xl2tpd", 100)].local_port
    offload(srv, call(5, tid=103).copy(peer_port=1702))
    second = srv.service.tunnels[("xl2tpd", 103)]
    assert (second.peer, second.peer_port) == ("192.0.2.7", 1702)
    assert srv.service.datapath.tunnels[103][0] is False  # no twin: its own address pair


def test_a_reused_session_id_is_offloaded_and_the_old_calls_late_end_spares_it(srv):
    """xl2tpd's call ids are random: a new call can get the id of one whose
    pppd just exited, before discovery reported that end."""
    from pipexctl.discovery.state import CallDown

    offload(srv, call(1))
    srv.channels.pop().close()  # the first pppd exits: the kernel drops its session
    new = call(1).copy(pppd_pid=4343, peer_call_id=77)
    ch, meta = srv.service.offload(new, 4343)
    srv.channels.append(ch)
    assert meta["peer_session_id"] == 77 and srv.service.backend.session_get(100, 1).peer_session_id == 77
    srv.service.on_event(CallDown(call=call(1), reason="pppd 4242 exited"))  # the old call's end, late
    assert srv.service.tunnels[("xl2tpd", 100)].records[1].pppd_pid == 4343
    assert srv.service.backend.session_get(100, 1).peer_session_id == 77
    srv.service.on_event(CallDown(call=new, reason="hung up"))  # the new call's own end
    assert 1 not in srv.service.tunnels[("xl2tpd", 100)].records


def test_a_reused_tunnel_id_replaces_the_dead_tunnel_and_its_late_end_spares_the_new_one(srv):
    from pipexctl.discovery.state import TunnelDown, TunnelInfo

    offload(srv, call(1))
    old_sock = srv.service.tunnels[("xl2tpd", 100)].sock
    new = call(5).copy(peer_tunnel_id=300, pppd_pid=4343)
    ch, meta = srv.service.offload(new, 4343)
    srv.channels.append(ch)
    ts = srv.service.tunnels[("xl2tpd", 100)]
    assert ts.peer_tunnel_id == 300 and list(ts.records) == [5] and old_sock.fileno() == -1
    assert srv.service.backend.tunnel_get(100).peer_tunnel_id == 300
    srv.service.on_event(TunnelDown(tunnel=TunnelInfo(instance="xl2tpd", peer="192.0.2.7", tunnel_id=100, peer_tunnel_id=200)))
    assert ("xl2tpd", 100) in srv.service.tunnels and srv.service.backend.tunnel_get(100).peer_tunnel_id == 300
    srv.service.on_event(TunnelDown(tunnel=TunnelInfo(instance="xl2tpd", peer="192.0.2.7", tunnel_id=100, peer_tunnel_id=300)))
    assert ("xl2tpd", 100) not in srv.service.tunnels
