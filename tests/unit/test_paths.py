"""offload.paths.private_dir: what the daemon makes is 0700, what exists
keeps its mode, and a directory someone else owns or could write is
refused.  test_trust.py has the 0700 leaf, the never-chmodded 0755
directory, modes 0777/1777/0775 and a symlink; these are the other cases.
The tests run as root."""

from __future__ import annotations

import os
import re
import stat

import pytest

from pipexctl import errors
from pipexctl.offload import paths


def mode_of(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_an_existing_private_directory_is_accepted_as_it_is(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    os.chmod(d, 0o750)  # readable by the group, writable by root alone: accepted
    (d / "serve.sock").write_text("")
    paths.private_dir(str(d), "socket")
    assert mode_of(d) == 0o750 and os.listdir(d) == ["serve.sock"]


def test_a_missing_directory_is_made_0700_whatever_the_umask(tmp_path):
    d = tmp_path / "pipexctl"
    old = os.umask(0)
    try:
        paths.private_dir(str(d), "state")
    finally:
        os.umask(old)
    st = os.lstat(d)
    assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid()


def test_missing_parents_are_made_0700_too(tmp_path):
    old = os.umask(0)  # a daemon started with umask 0: the parents would be 0777, anyone may rename the leaf
    try:
        paths.private_dir(str(tmp_path / "a" / "b" / "sock"), "socket")
    finally:
        os.umask(old)
    assert [mode_of(tmp_path / p) for p in ("a", "a/b", "a/b/sock")] == [0o700, 0o700, 0o700]


@pytest.mark.parametrize("mode", [0o720, 0o702, 0o1770], ids=oct)
def test_group_or_others_write_alone_is_enough_to_refuse(tmp_path, mode):
    d = tmp_path / "open"
    d.mkdir()
    os.chmod(d, mode)
    with pytest.raises(errors.PermissionDeniedError) as e:
        paths.private_dir(str(d), "state")
    assert str(e.value) == (f"state directory {d} is writable by group or others (mode {mode:o}): refused, "
                            "use e.g. /run/pipexctl")
    assert mode_of(d) == mode  # refused, not repaired


def test_a_directory_owned_by_another_user_is_refused(tmp_path):
    d = tmp_path / "theirs"
    d.mkdir(mode=0o700)
    os.chmod(d, 0o700)
    os.chown(d, 65534, 65534)
    with pytest.raises(errors.PermissionDeniedError,
                       match=re.escape(f"socket directory {d} is owned by uid 65534, not by this daemon's uid "
                                       f"{os.geteuid()}: refused")):
        paths.private_dir(str(d), "socket")
    st = os.lstat(d)
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (65534, 0o700)  # neither chowned nor chmodded


def test_a_directory_owned_by_another_group_but_private_is_accepted(tmp_path):
    d = tmp_path / "ours"
    d.mkdir(mode=0o700)
    os.chmod(d, 0o750)
    os.chown(d, os.geteuid(), 65534)
    paths.private_dir(str(d), "socket")


def test_a_file_where_the_directory_should_be_is_refused(tmp_path):
    f = tmp_path / "run"
    f.write_text("not a directory")
    os.chmod(f, 0o600)
    with pytest.raises(errors.PermissionDeniedError, match="is not a directory"):
        paths.private_dir(str(f), "state")
    assert f.read_text() == "not a directory"


def test_a_dangling_symlink_is_refused_and_nothing_is_made_at_its_target(tmp_path):
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(errors.PermissionDeniedError, match="is not a directory"):
        paths.private_dir(str(tmp_path / "link"), "socket")
    assert not os.path.lexists(tmp_path / "elsewhere")


def test_an_empty_directory_name_is_the_current_directory(tmp_path, monkeypatch):
    """os.path.dirname("serve.sock") is "": the socket beside the daemon."""
    os.chmod(tmp_path, 0o777)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(errors.PermissionDeniedError, match=r"socket directory \. is writable"):
        paths.private_dir("", "socket")
    os.chmod(tmp_path, 0o700)
    paths.private_dir("", "socket")
