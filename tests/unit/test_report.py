"""What the offload service reports for ``status`` (report.py): every call,
its data path and why it was not offloaded, through `pipexctl status`.
The ``metrics`` half of report.py is test_metrics.py's."""

from __future__ import annotations

import json

from click.testing import CliRunner

from pipexctl.cli import cli

from .conftest import call, offload, serving


def test_status_names_every_call_its_path_and_why_one_stayed_on_the_pty(srv, tmp_path):
    offload(srv, call(1))
    srv.service.refused("no_call", 5151)
    c3 = srv.watch.d.tracker.inst("xl2tpd").calls[3]
    c3.pppd_pid, c3.data_path = 5151, "userspace"
    with serving(srv):
        r = CliRunner().invoke(cli, ["status", "--socket", srv.socket_path, "--json"])
        assert r.exit_code == 0, r.output
        calls = {c["call_id"]: c for c in json.loads(r.output)["calls"]}
        assert calls[1]["path"] == "offloaded" and calls[2]["path"] == "xl2tpd kernel mode"
        assert calls[3]["path"] == "pty" and calls[3]["why_not"] == "no_call"
        r = CliRunner().invoke(cli, ["status", "--socket", srv.socket_path])
        assert r.exit_code == 0 and "offloads: 1 made" in r.output
        assert "WHY-NOT" in r.output and "no_call" in r.output
