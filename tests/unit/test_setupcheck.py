"""`pipexctl check offload` (setupcheck.py): the daemon and each pppd
options file of xl2tpd's config, checked piece by piece."""

from __future__ import annotations

from .conftest import serving


def test_check_offload_reports_the_setup_piece_by_piece(srv, tmp_path):
    from pipexctl.offload import pppopts
    from pipexctl.offload.setupcheck import offload_checks

    opts, conf = tmp_path / "options.lns", tmp_path / "xl2tpd.conf"
    opts.write_text("noauth\n")
    conf.write_text(f"[lns default]\npppoptfile = {opts}\n")
    got = {c.name: c for c in offload_checks(str(conf), srv.socket_path)}
    assert not got["daemon"].ok and not got[f"options {opts}"].ok
    assert "pipexctl offload enable" in got[f"options {opts}"].detail
    assert all(not c.required for c in got.values())  # warnings: a half set-up host is no failure
    pppopts.manage([str(opts)], pppopts.block())
    with serving(srv):
        got = {c.name: c for c in offload_checks(str(conf), srv.socket_path)}
    assert got["daemon"].ok and got[f"options {opts}"].ok
    if "plugin" in got:  # this host's pppd (Debian's ppp) with the set-up's plugin
        assert got["plugin"].ok, got["plugin"].detail
