"""The offload service's failpoints (service.py): PIPEXCTL_FAILPOINT is
read when the daemon is made, and a name or a stall it does not know is
refused then.  The failpoints themselves fire in the guest
(tests/kernel/test_faults.py)."""

from __future__ import annotations

import pytest

from pipexctl import errors
from pipexctl.discovery.discovery import Discovery
from pipexctl.kernel.backend import NullBackend
from pipexctl.offload.datapath import NullDataPath
from pipexctl.offload.server import OffloadServer


def test_an_unknown_failpoint_is_refused_by_name(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPEXCTL_FAILPOINT", "state-saved,tunnel-made")
    with pytest.raises(errors.InvalidArgumentError, match="unknown tunnel-made"):
        OffloadServer(str(tmp_path / "s.sock"), Discovery([], proc=False, kernel=False), NullBackend(), NullDataPath())
    monkeypatch.setenv("PIPEXCTL_FAILPOINT", "state-saved@x")
    with pytest.raises(errors.InvalidArgumentError, match="seconds must be a number"):
        OffloadServer(str(tmp_path / "s.sock"), Discovery([], proc=False, kernel=False), NullBackend(), NullDataPath())
    monkeypatch.setenv("PIPEXCTL_FAILPOINT", "state-saved,session-created@2.5")
    s = OffloadServer(str(tmp_path / "s.sock"), Discovery([], proc=False, kernel=False), NullBackend(), NullDataPath())
    assert s.service.failpoints == {"state-saved": None, "session-created": 2.5}
