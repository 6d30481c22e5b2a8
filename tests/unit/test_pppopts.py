"""pppd's options files (offload/pppopts.py), through `pipexctl offload
enable/disable`: pipexctl's block added, updated and removed, no line
outside it touched, each file's mode and owner kept, and every file changed
or none."""

from __future__ import annotations

import json
import os


def test_an_options_file_keeps_its_mode_and_owner(run, tmp_path):
    f = tmp_path / "options.l2tpd.lns"
    f.write_text("noccp\n")
    f.chmod(0o640)
    assert run("offload", "enable", "--options", str(f)).exit_code == 0
    assert "plugin pipexctl.so" in f.read_text() and (f.stat().st_mode & 0o7777) == 0o640
    assert [x.name for x in tmp_path.iterdir()] == [f.name]  # no temp file left


def test_offload_enable_and_disable_edit_only_their_block(tmp_path):
    from click.testing import CliRunner

    from pipexctl.cli import cli

    opts = tmp_path / "options.xl2tpd"
    opts.write_text("noauth\nmtu 1400\n")
    os.chmod(opts, 0o640)
    conf = tmp_path / "xl2tpd.conf"
    conf.write_text(f"[lns default]\npppoptfile = {opts}\n")
    r = CliRunner().invoke(cli, ["offload", "enable", "--xl2tpd-conf", str(conf), "--dry-run"])
    assert r.exit_code == 0 and f"would change: {opts}" in r.output and opts.read_text() == "noauth\nmtu 1400\n"
    r = CliRunner().invoke(cli, ["offload", "enable", "--xl2tpd-conf", str(conf), "--required", "--timeout", "9"])
    assert r.exit_code == 0 and f"changed: {opts}" in r.output
    text = opts.read_text()
    assert text.startswith("noauth\nmtu 1400\n") and "plugin pipexctl.so\n" in text and "pipexctl_timeout 9\n" in text
    assert os.stat(opts).st_mode & 0o777 == 0o640  # the file's mode kept
    r = CliRunner().invoke(cli, ["offload", "enable", "--xl2tpd-conf", str(conf), "--required", "--timeout", "9",
                                 "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["changed"] == []
    r = CliRunner().invoke(cli, ["offload", "disable", "--options", str(opts)])
    assert r.exit_code == 0 and opts.read_text() == "noauth\nmtu 1400\n"
    bad = tmp_path / "kernel-mode"
    bad.write_text("plugin pppol2tp.so\n")
    r = CliRunner().invoke(cli, ["offload", "enable", "--options", str(opts), "--options", str(bad)])
    assert r.exit_code == 1 and "outside pipexctl's block" in r.output
    assert opts.read_text() == "noauth\nmtu 1400\n"  # all or nothing: the good file untouched too
    r = CliRunner().invoke(cli, ["offload", "enable", "--options", str(opts), "--timeout", "61"])
    assert r.exit_code == 2
    r = CliRunner().invoke(cli, ["offload", "enable", "--options", str(opts), "--move", "3601"])
    assert r.exit_code == 2 and opts.read_text() == "noauth\nmtu 1400\n"
    r = CliRunner().invoke(cli, ["offload", "enable", "--options", str(opts), "--move", "0"])
    assert r.exit_code == 0 and "pipexctl_move 0\n" in opts.read_text()  # no live move for these calls
