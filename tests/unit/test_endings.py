"""How offloaded tunnels end (endings.py), on the null kernel backend and
the null data path.  Ends that wait for an exit are test_trust.py's."""

from __future__ import annotations

from .conftest import call, offload


def test_a_dropped_tunnel_closes_its_socket(srv):
    from pipexctl.discovery.state import TunnelDown, TunnelInfo

    offload(srv, call(1))
    sock = srv.service.tunnels[("xl2tpd", 100)].sock
    srv.service.on_event(TunnelDown(tunnel=TunnelInfo(instance="xl2tpd", peer="192.0.2.7", tunnel_id=100, peer_tunnel_id=200)))
    assert srv.service.datapath.tunnels == {} and srv.service.tunnels == {} and sock.fileno() == -1


def test_two_calls_with_one_call_id_on_two_tunnels_keep_their_own_ptys(srv):
    """xl2tpd gave both calls the id 7: each offloaded call's pty is held
    apart (one key would have let the second hold close the first's pty)
    and one call's end lets go of its own only."""
    import os

    from pipexctl.discovery.state import CallDown
    from pipexctl.offload.ptys import call_key

    a, b = call(7, tid=100), call(7, tid=101, peer="192.0.2.8")
    masters = []
    for c in (a, b):
        offload(srv, c)
        master, slave = os.openpty()
        masters.append(master)
        srv.service.ptys.hold(call_key(c.instance, c.tunnel_id, c.call_id), slave)
    try:
        held = [srv.service.ptys.held(call_key("xl2tpd", tid, 7)) for tid in (100, 101)]
        assert None not in held and held[0] != held[1]
        srv.channels.pop(0).close()  # a's pppd exits: its end is confirmed
        srv.service.exits.alive = lambda pid, name="pppd": False
        srv.service.on_event(CallDown(call=a, reason="hung up"))
        assert srv.service.ptys.held(call_key("xl2tpd", 100, 7)) is None
        assert srv.service.ptys.held(call_key("xl2tpd", 101, 7)) == held[1]
        assert list(srv.service.tunnels[("xl2tpd", 101)].records) == [7]
    finally:
        for m in masters:
            os.close(m)
