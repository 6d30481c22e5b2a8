"""The daemon's view of discovery (watch.py): a request finds its pppd's
call in the log itself.  Its wake-ups are test_watch_wakeups.py's."""

from __future__ import annotations

from pipexctl.discovery.discovery import Discovery
from pipexctl.kernel.backend import NullBackend
from pipexctl.offload.datapath import NullDataPath
from pipexctl.offload.server import OffloadServer


def test_a_request_reads_the_call_from_the_log_without_waiting_for_the_watcher(tmp_path):
    """The pppd's call is in the log when it asks: the request finds it at
    once, though the watcher (not running here) would poll only later."""
    log = tmp_path / "xl2tpd.log"
    log.write_text("xl2tpd[147]: xl2tpd version xl2tpd-1.3.18 started on (none) PID:147\n")
    d = Discovery([str(log)], proc=False, kernel=False)
    s = OffloadServer(str(tmp_path / "s.sock"), d, NullBackend(), NullDataPath(), wait=3.0, log_interval=60)
    try:
        d.refresh(events=False)  # as serve_forever starts
        with log.open("a") as f:
            f.write("xl2tpd[147]: Connection established to 10.99.1.2, 1701.  Local: 28398, Remote: 58717 "
                    "(ref=0/0).  LNS session is 'default'\n"
                    "xl2tpd[147]: Call established with 10.99.1.2, PID: 151, Local: 19361, Remote: 13604, Serial: 1\n")
        call, why = s.watch.call_of(151, s.wait)  # before: "no call names this pid" after the 3 s
        assert call is not None, why
        assert (call.tunnel_id, call.peer_tunnel_id, call.call_id, call.peer_call_id) == (28398, 58717, 19361, 13604)
        assert s.watch.pending and s.watch.pending[-1].event == "CallUp"  # the watcher still gets the events
    finally:
        d.close()
