"""The twins' nft table (offload/steering.py): its text checked by `nft
-c`, written with the first twin and removed with the last, put back whole
after a flush, adopted twins written in one transaction (the steering
against the real kernel: tests/kernel/test_datapath.py)."""

from __future__ import annotations

import shutil
import subprocess

from pipexctl import errors
from pipexctl.offload import steering
from pipexctl.offload.steering import Twin

TWINS = [Twin("10.99.1.1", 40000, "10.99.1.2", 1701, 4660), Twin("10.99.1.1", 40001, "10.99.1.2", 1701, 4661)]


def test_nft_accepts_the_steering_table_and_its_elements():
    nft = shutil.which("nft")
    assert nft, "nft is needed (make setup installs nftables)"
    text = steering.table() + steering.elements("add", TWINS)
    assert "@th,80,16 map @twins " in text and "@th,96,16 map @twins_l " in text and 'iif != "lo"' in text
    r = subprocess.run([nft, "-c", "-f", "-"], input=text, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "10.99.1.2 . 1701 . 4660 : 40000" in text and "10.99.1.1 . 40001" in text
    assert steering.elements("add", []) == ""


class FakeNft:
    """Stands for nftables: what ran, and a table that a flush can remove."""

    def __init__(self):
        self.ran, self.table = [], False

    def run(self, text):
        if text.startswith("add element") or text.startswith("delete element"):
            if not self.table:
                raise errors.KernelError("No such file or directory")
        self.ran.append(text)
        self.table = "delete table" not in text and (self.table or "add table" in text)

    def exists(self, command):
        return self.table


def test_steering_writes_the_table_with_the_first_twin_and_removes_it_with_the_last():
    nft = FakeNft()
    st = steering.Steering(nft)
    st.add(TWINS[0])
    assert nft.ran[-1].startswith("add table ip pipexctl") and nft.table
    st.add(TWINS[1])
    assert nft.ran[-1].startswith("add element") and "4661" in nft.ran[-1]
    st.remove(TWINS[0])
    assert nft.ran[-1].startswith("delete element") and "4660" in nft.ran[-1]
    st.remove(TWINS[1])
    assert "delete table ip pipexctl" in nft.ran[-1] and not nft.table


def test_a_flushed_table_is_put_back_whole_by_check_and_by_the_next_add():
    nft = FakeNft()
    st = steering.Steering(nft)
    st.add(TWINS[0])
    nft.table = False  # nft flush ruleset
    assert st.check() and nft.table and st.restored == 1
    assert "4660" in nft.ran[-1] and nft.ran[-1].startswith("add table")
    assert not st.check()  # nothing to do while it is there
    nft.table = False
    st.add(TWINS[1])  # the element add fails, the whole table is written
    assert nft.table and "4660" in nft.ran[-1] and "4661" in nft.ran[-1]


def test_adopted_twins_are_written_in_one_transaction_by_settle():
    """After a restart every adopted twin's elements go in with the table in
    one nft transaction: none of them is ever without its steering."""
    nft = FakeNft()
    st = steering.Steering(nft)
    for t in TWINS:
        st.hold(t)
    assert nft.ran == []
    st.settle()
    assert len(nft.ran) == 1 and "4660" in nft.ran[0] and "4661" in nft.ran[0] and "flush table" in nft.ran[0]
    st2 = steering.Steering(nft)
    st2.settle()  # nothing held (none adopted): the stale table goes
    assert "delete table ip pipexctl" in nft.ran[-1] and not nft.table
