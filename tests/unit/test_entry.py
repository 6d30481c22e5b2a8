"""pipexctl/entry.py: how the pipexctl command starts."""

from __future__ import annotations

# a process that starts as the pipexctl command does (its entry point, then the CLI)
COMMAND_START = ("import sys\nsys.argv = ['pipexctl', 'serve', '--help']\nfrom pipexctl.entry import main\n"
                 "try:\n    main()\nexcept SystemExit:\n    pass\n")


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
    want = hashlib.sha256(b"x" * 100).hexdigest()
    for code, mapped in ((COMMAND_START + probe, "False"), (probe, "True")):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        assert out.splitlines()[-2:] == [want, mapped], out[-500:]


def test_the_command_leaves_out_pydantics_plugin_loader_and_pydantic_still_asks_it(tmp_path):
    """pipexctl/entry.py puts a loader that finds no plugins in place of
    pydantic's, whose import brings importlib.metadata (1.4 MiB of serve's
    RSS).  If a pydantic upgrade stopped asking ``pydantic.plugin._loader``
    for its plugins, the stub would go unused (and the memory come back):
    the stub must be asked once a model is built, importlib.metadata must
    not be imported by what serve imports, and validation must still refuse
    a bad value.  The second run, without the entry point, shows that the
    probe sees importlib.metadata when pydantic's loader is there."""
    import subprocess
    import sys

    probe = ("import sys\n"
             "loader = sys.modules.get('pydantic.plugin._loader')\n"
             "asked = []\n"
             "if loader is not None:\n"
             "    loader.get_plugins = lambda: asked.append(1) or ()\n"
             "import pipexctl.offload.server, pipexctl.cli, pipexctl.discovery.discovery\n"
             "from pydantic import BaseModel\n"
             "class Late(BaseModel):\n"
             "    x: int\n"
             "try:\n"
             "    Late(x='not a number')\n"
             "    print('accepted')\n"
             "except Exception as e:\n"
             "    print(type(e).__name__)\n"
             "print(loader is not None and len(asked) > 0, 'importlib.metadata' in sys.modules)\n")
    for code, want in ((COMMAND_START + probe, "True False"), (probe, "False True")):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        assert out.splitlines()[-2:] == ["ValidationError", want], out[-500:]
