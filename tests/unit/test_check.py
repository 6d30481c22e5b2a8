"""What the running kernel offers (kernel/check.py): whether it finds an
L2TP session by its ids in the whole namespace (Linux 6.11 and later),
read from its release."""

from __future__ import annotations

import pytest

from pipexctl.kernel.check import sessions_per_namespace


@pytest.mark.parametrize("release, per_namespace", [
    ("6.1.0-57-amd64", False), ("6.10.14", False), ("6.11.0", True), ("6.12.117+deb13-amd64", True),
    ("7.0.1-arch1", True), ("5.15.0-1-generic", False), ("garbage", False),
])
def test_twins_are_steered_only_before_linux_6_11(release, per_namespace):
    assert sessions_per_namespace(release) is per_namespace
