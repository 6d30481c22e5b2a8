"""pipexctl/entry.py: how the pipexctl command starts."""

from __future__ import annotations


def test_the_command_never_loads_openssl_and_its_hashes_still_work(tmp_path):
    """pipexctl/entry.py keeps libcrypto out of the command's process (3.5 MiB
    of serve's RSS); what serve hashes (a checkpoint's tail) must still hash
    the same.  The second run, without the entry point, shows that the probe
    can see libcrypto when it is there."""
    import hashlib
    import subprocess
    import sys

    (tmp_path / "f").write_bytes(b"x" * 100)
    probe = ("import os, sys\n"
             "import pipexctl.offload.server, pipexctl.cli\n"
             "from pipexctl.discovery import checkpoint\n"
             f"fd = os.open({str(tmp_path / 'f')!r}, os.O_RDONLY)\n"
             "print(checkpoint.file_tail(fd, 100))\n"
             "print(any('libcrypto' in ln for ln in open('/proc/self/maps')))\n")
    entry = ("import sys\nsys.argv = ['pipexctl', 'serve', '--help']\nfrom pipexctl.entry import main\n"
             "try:\n    main()\nexcept SystemExit:\n    pass\n")
    want = hashlib.sha256(b"x" * 100).hexdigest()
    for code, mapped in ((entry + probe, "False"), (probe, "True")):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        assert out.splitlines()[-2:] == [want, mapped], out[-500:]
