"""Churn in CI: connect/disconnect cycles of offloaded calls, each way of
ending a call, then leaks counted by iproute2, /proc/net/pppol2tp, nft and
/proc/<serve>/fd (pipexctl.testing.churn; `make churn` runs 1,000 cycles)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pipexctl.testing.churn import KINDS, churn

pytestmark = [pytest.mark.kernel, pytest.mark.long("110 s under TCG; `make churn` runs 1,000 cycles"), pytest.mark.one_debian("call lifecycles in the daemon; the kernel calls it makes are the offload tests'")]


def test_churn_leaves_nothing():
    rep = churn(cycles=18, lacs=2, sections=3)
    if os.environ.get("PIPEXCTL_RESULTS"):
        Path(os.environ["PIPEXCTL_RESULTS"], "churn.json").write_text(json.dumps(rep, indent=2))
    assert rep["cycles"] == 18 and rep["rounds"] == 3
    assert rep["faults"] == {k: 6 for k in KINDS}
    assert rep["leaked"] == {"objects": 0, "fds": 0}, rep
    # every call went through the daemon on each side, none failed
    assert rep["stats"]["lns"]["offloaded"] == 18 and rep["stats"]["lns"]["failed"] == 0
    assert sum(rep["stats"][n]["offloaded"] for n in ("lac1", "lac2")) == 18
