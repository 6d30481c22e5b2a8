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
