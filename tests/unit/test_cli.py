"""The CLI through click's CliRunner, on the in-memory NullBackend (``run``,
tests/unit/conftest.py)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from pipexctl.cli import cli

EXAMPLE = ["addsess", "l2tp", "--version", "3", "--pw", "eth", "--encap", "udp", "--tunnel-id", "100",
           "--peer-tunnel-id", "200", "--session-id", "10", "--peer-session-id", "20",
           "--local", "10.98.0.1:5000", "--remote", "10.98.0.2:5001", "--ifname", "pw0"]
OPENBSD = ["addsess", "l2tp", "10", "20", "10.99.0.1", "10.99.1.2", "255.255.255.255",
           "10.99.0.1:1701", "10.99.0.2:1701", "100", "200"]


def test_long_form_creates_tunnel_and_session(run):
    r = run(*EXAMPLE)
    assert r.exit_code == 0, r.output
    assert r.output.strip() == "session 10 in tunnel 100 created (tunnel 100 created, interface pw0)"
    t = run.backend.tunnel_get(100)
    assert (t.peer_tunnel_id, t.version, str(t.local), str(t.remote)) == (200, 3, "10.98.0.1:5000", "10.98.0.2:5001")
    s = run.backend.session_get(100, 10)
    assert (s.peer_session_id, s.pw_type.value, s.ifname) == (20, "eth", "pw0")


def test_openbsd_positional_form_is_v2_ppp(run):
    r = run(*OPENBSD, "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["tunnel"]["version"] == 2 and out["session"]["pw_type"] == "ppp"
    assert out["tunnel"]["local"] == {"address": "10.99.0.1", "port": 1701}
    assert (out["tunnel"]["tunnel_id"], out["tunnel"]["peer_tunnel_id"]) == (100, 200)
    assert (out["session"]["session_id"], out["session"]["peer_session_id"]) == (10, 20)
    assert out["framed_addr"] == "10.99.1.2" and out["framed_netmask"] == "255.255.255.255"


def test_positional_form_without_the_word_l2tp(run):
    r = run("addsess", *OPENBSD[2:])
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("args,msg", [
    (OPENBSD[:-1], "the positional form takes 9 values"),
    (OPENBSD[:-1] + ["x"], "peer-tun-id: 'x' is not a number"),
    (OPENBSD[:5] + ["nope"] + OPENBSD[6:], "framed-addr: 'nope' is not an IP address"),
    (OPENBSD + ["--tunnel-id", "5"], "either positionally or as options, not both (--tunnel-id)"),
    (["addsess", "l2tp", "10", "20", "10.99.0.1", "10.99.1.2", "255.255.255.255", "10.99.0.1:1701",
      "10.99.0.2:1701", "70000", "200"], "tunnel id 70000 out of range for L2TPv2 (1..65535)"),
    (EXAMPLE[:-2] + ["--ifname", "this-name-is-too-long"], "bad interface name"),
    (["addsess", "--version", "2", "--pw", "eth", "--tunnel-id", "1", "--session-id", "1", "--peer-session-id", "1"],
     "L2TPv2 carries PPP only"),
    (["addsess", "--tunnel-id", "1", "--session-id", "1"], "missing --peer-session-id"),
    (["addsess", "--tunnel-id", "1", "--session-id", "1", "--peer-session-id", "2", "--local", "1.2.3.4:5"],
     "creating the tunnel needs --peer-tunnel-id"),
    (EXAMPLE[:-4] + ["--remote", "nohost:1"], "--remote: bad endpoint 'nohost:1'"),
    (EXAMPLE + ["--fd-to", "/tmp/x.sock"], "--fd-to hands over a PPPoL2TP socket: it needs --pw ppp"),
])
def test_usage_errors_exit_2_with_one_line(run, args, msg):
    r = run(*args)
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pipexctl: error: ")
    assert msg in lines[0]
    assert run.backend.tunnel_dump() == []


def test_operational_errors_exit_1(run):
    assert run(*EXAMPLE).exit_code == 0
    r = run(*EXAMPLE)
    assert r.exit_code == 1
    assert r.output.strip() == "pipexctl: error: session 10 in tunnel 100 already exists"
    r = run("deltun", "--tunnel-id", "7")
    assert r.exit_code == 1 and r.output.strip() == "pipexctl: error: cannot delete tunnel 7: it does not exist"
    r = run("addsess", "--tunnel-id", "9", "--session-id", "1", "--peer-session-id", "2")
    assert r.exit_code == 1 and "tunnel 9 does not exist" in r.output


def test_every_command_turns_a_library_error_into_one_line(run, tmp_path):
    """The group's one handler covers subcommands too: `offload enable` on
    a file it cannot write (it ended in a traceback when each command
    carried its own handler and this one had none)."""
    r = run("offload", "enable", "--options", str(tmp_path / "missing-dir" / "options"))
    assert r.exit_code == 2 and r.output.strip() == (
        f"pipexctl: error: cannot write {tmp_path}/missing-dir/options: No such file or directory")
    assert r.exception is None or isinstance(r.exception, SystemExit)


def test_click_usage_errors_exit_2(run):
    r = run("delsess", "--tunnel-id", "1")
    assert r.exit_code == 2 and "Missing option '--session-id'" in r.output
    r = run("addsess", "--tunnel-id", "-1")
    assert r.exit_code == 2


def test_json_gives_cookies_as_the_hex_they_were_given_in(run):
    """A cookie is bytes, not text: the JSON of a session gives it as hex,
    as --cookie takes it, whatever its bytes (pydantic's dump gave bytes as
    UTF-8 text, and refused a cookie that is not)."""
    r = run(*EXAMPLE, "--cookie", "00ff10a0", "--peer-cookie", "0123456789abcdef", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)["session"]
    assert (out["cookie"], out["peer_cookie"]) == ("00ff10a0", "0123456789abcdef")
    assert json.loads(run("showsess", "--json").output)[0]["cookie"] == "00ff10a0"


def test_show_stat_delete(run):
    assert run(*EXAMPLE).exit_code == 0
    r = run("showsess")
    assert r.output.splitlines() == [
        "TUNNEL  SESSION  PEER-TUNNEL  PEER-SESSION  PW   IFNAME",
        "100     10       200          20            eth  pw0",
    ]
    r = run("showsess", "--json")
    assert json.loads(r.output)[0]["ifname"] == "pw0"
    r = run("showtun", "--json")
    assert json.loads(r.output)[0]["tunnel_id"] == 100
    r = run("showtun")
    assert r.output.splitlines()[1].split() == ["100", "200", "v3", "udp", "10.98.0.1:5000", "10.98.0.2:5001"]
    r = run("stat", "--json")
    assert json.loads(r.output) == [{"tunnel_id": 100, "session_id": 10, "tx_packets": 0, "tx_bytes": 0, "tx_errors": 0,
                                     "rx_packets": 0, "rx_bytes": 0, "rx_seq_discards": 0, "rx_oos_packets": 0,
                                     "rx_errors": 0, "rx_cookie_discards": 0, "rx_invalid": 0}]
    r = run("stat", "--session-id", "10")
    assert r.exit_code == 2 and "--session-id needs --tunnel-id" in r.output
    r = run("delsess", "l2tp", "--tunnel-id", "100", "--session-id", "10", "--tunnel-too")
    assert r.exit_code == 0 and r.output.strip() == "session 10 in tunnel 100 deleted; tunnel 100 deleted"
    assert run.backend.tunnel_dump() == []


def test_addtun_deltun(run):
    r = run("addtun", "--tunnel-id", "5", "--peer-tunnel-id", "6", "--local", "[fd00::1]:1", "--remote", "[fd00::2]:2",
            "--udp6-zero-csum-tx")
    assert r.exit_code == 0, r.output
    assert r.output.strip() == "tunnel 5 created (peer 6, L2TPv3/udp)"
    assert run("deltun", "--tunnel-id", "5").output.strip() == "tunnel 5 deleted"
    r = run("showtun", "--tunnel-id", "5")
    assert r.exit_code == 1 and "tunnel 5 does not exist" in r.output


def test_version():
    r = CliRunner().invoke(cli, ["--version"])
    assert r.exit_code == 0 and r.output.startswith("pipexctl, version ")


@pytest.mark.parametrize("cmd", sorted(cli.commands))
def test_every_command_has_help_with_an_example(cmd):
    r = CliRunner().invoke(cli, [cmd, "--help"])
    assert r.exit_code == 0
    assert "Example" in r.output, f"{cmd} --help has no example"


def test_cli_rejects_a_bad_metrics_address():
    r = CliRunner().invoke(cli, ["serve", "--metrics", "nonsense"])
    assert r.exit_code == 2 and "expected [HOST]:PORT" in r.output


def test_stat_serve_without_a_daemon_is_one_clear_error(tmp_path):
    r = CliRunner().invoke(cli, ["stat", "--serve", "--socket", str(tmp_path / "none.sock")])
    assert r.exit_code == 1
    assert "cannot ask pipexctl serve" in r.output and "Traceback" not in r.output
