"""pipexctl/entry.py: how the pipexctl command starts."""

from __future__ import annotations

# a process that starts as the pipexctl command does (its entry point, then the CLI)
COMMAND_START = ("import sys\nsys.argv = ['pipexctl', 'serve', '--help']\nfrom pipexctl.entry import main\n"
                 "try:\n    main()\nexcept SystemExit:\n    pass\n")


def test_the_command_never_loads_openssl_and_its_hashes_still_work(tmp_path):
    """pipexctl/entry.py keeps libcrypto out of the command's process (3.5 MiB
    of serve's RSS), with --metrics too (prometheus_client's import mapped
    it through libssl); what serve hashes (a checkpoint's tail) must still hash
    the same.  The second run, without the entry point, shows that the probe
    can see libcrypto when it is there."""
    import hashlib
    import subprocess
    import sys

    (tmp_path / "f").write_bytes(b"x" * 100)
    probe = ("import os, sys\n"
             "import pipexctl.offload.server, pipexctl.offload.metrics, pipexctl.cli\n"
             "from pipexctl.discovery import checkpoint\n"
             f"fd = os.open({str(tmp_path / 'f')!r}, os.O_RDONLY)\n"
             "print(checkpoint.file_tail(fd, 100))\n"
             "print(any('libcrypto' in ln for ln in open('/proc/self/maps')))\n")
    want = hashlib.sha256(b"x" * 100).hexdigest()
    for code, mapped in ((COMMAND_START + probe, "False"), (probe, "True")):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        assert out.splitlines()[-2:] == [want, mapped], out[-500:]


def test_serve_and_the_cli_import_no_validation_library():
    """Serve's records are checked by pipexctl/records.py, not pydantic,
    whose import was 14 to 15 MiB of serve's RSS (issue 17's 50 MiB target).
    What serve, the CLI and discovery import must not bring it (or msgspec)
    back in; the second run shows the probe sees a module that is imported."""
    import subprocess
    import sys

    probe = ("import sys\n"
             "import pipexctl.offload.server, pipexctl.cli, pipexctl.discovery.discovery, pipexctl.discovery.checkpoint\n"
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pydantic', 'pydantic_core', 'msgspec')))\n")
    out = subprocess.run([sys.executable, "-c", COMMAND_START + probe], capture_output=True, text=True,
                         check=True).stdout
    assert out.splitlines()[-1] == "[]", out[-500:]
    seen = subprocess.run([sys.executable, "-c", "import json\n" + probe.replace("'msgspec')", "'msgspec', 'json')")],
                          capture_output=True, text=True, check=True).stdout
    assert "'json'" in seen.splitlines()[-1], seen[-500:]


def test_serve_with_metrics_imports_no_http_email_or_tls_library():
    """`serve --metrics` answers HTTP itself (pipexctl/offload/metrics.py):
    prometheus_client's import, with http.server, urllib, email and ssl, was
    5.8 MiB of the daemon's RSS.  The endpoint is started and scraped here;
    the second run shows the probe sees such a module when it is imported."""
    import subprocess
    import sys

    probe = ("import sys, socket\n"
             "from pipexctl.offload import metrics\n"
             "class C:\n    def pieces(self):\n        return [b'x 1.0\\n']\n"
             "ex = metrics.Exporter(C(), '127.0.0.1', 0)\n"
             "with socket.create_connection(ex.address) as s:\n"
             "    s.sendall(b'GET /metrics HTTP/1.1\\r\\n\\r\\n')\n"
             "    assert s.recv(100).startswith(b'HTTP/1.1 200')\n"
             "ex.shutdown()\n"
             "print(sorted(m for m in sys.modules if m == 'urllib.request' or m.split('.')[0] in "
             "('prometheus_client', 'http', 'email', 'ssl', '_ssl', 'wsgiref')))\n")
    out = subprocess.run([sys.executable, "-c", COMMAND_START + probe], capture_output=True, text=True,
                         check=True).stdout
    assert out.splitlines()[-1] == "[]", out[-500:]
    seen = subprocess.run([sys.executable, "-c", "import email\n" + probe], capture_output=True, text=True,
                          check=True).stdout
    assert "'email'" in seen.splitlines()[-1], seen[-500:]
