"""files.atomic_write: the new file whole with the mode asked (or the old
file's mode and owner with keep_owner), the temp path beside it never
followed, and a failure leaving the old file and no temp file.  (The state
file's own temp-symlink case is in test_trust.py, through statefile.save.)"""

from __future__ import annotations

import errno
import os
import stat

import pytest

from pipexctl import files


def tmp_of(path) -> str:
    return f"{path}.tmp-{os.getpid()}"


def mode_of(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_a_new_file_has_the_content_and_the_default_mode_0600(tmp_path):
    p = tmp_path / "state.json"
    files.atomic_write(str(p), b'{"tunnels":[]}')
    assert p.read_bytes() == b'{"tunnels":[]}'
    assert mode_of(p) == 0o600
    assert sorted(os.listdir(tmp_path)) == ["state.json"]  # no temp file left beside it


def test_the_mode_is_exact_whatever_the_umask(tmp_path):
    p = tmp_path / "options.l2tpd"
    old = os.umask(0o077)  # would strip 0o044 from a plain open(..., 0o644)
    try:
        files.atomic_write(str(p), b"noauth\n", mode=0o644)
    finally:
        os.umask(old)
    assert mode_of(p) == 0o644


def test_an_existing_file_is_replaced_by_a_new_inode(tmp_path):
    p = tmp_path / "state.json"
    p.write_bytes(b"old content that is longer than the new one")
    before = os.stat(p).st_ino
    with open(p, "rb") as reader:  # a reader of the old file keeps the old file: a rename, not a rewrite
        files.atomic_write(str(p), b"new")
        assert reader.read() == b"old content that is longer than the new one"
    assert p.read_bytes() == b"new"
    assert os.stat(p).st_ino != before


def test_without_keep_owner_the_old_mode_and_owner_do_not_carry_over(tmp_path):
    p = tmp_path / "state.json"
    p.write_bytes(b"old")
    os.chmod(p, 0o666)
    os.chown(p, 65534, 65534)
    files.atomic_write(str(p), b"new")
    st = os.stat(p)
    assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o600, os.geteuid(), os.getegid())


def test_keep_owner_carries_the_existing_files_mode_and_owner_over(tmp_path):
    p = tmp_path / "options.l2tpd"
    p.write_bytes(b"old")
    os.chown(p, 65534, 65533)  # an operator's file, not root's (the tests run as root)
    os.chmod(p, 0o640)
    files.atomic_write(str(p), b"new\n", mode=0o644, keep_owner=True)
    st = os.stat(p)
    assert p.read_bytes() == b"new\n"
    assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o640, 65534, 65533)


def test_keep_owner_without_an_existing_file_uses_mode(tmp_path):
    p = tmp_path / "options.l2tpd"
    files.atomic_write(str(p), b"new\n", mode=0o644, keep_owner=True)
    st = os.stat(p)
    assert (stat.S_IMODE(st.st_mode), st.st_uid) == (0o644, os.geteuid())


def test_short_writes_are_continued_until_the_data_is_whole(tmp_path, monkeypatch):
    real = os.write
    monkeypatch.setattr(os, "write", lambda fd, b: real(fd, bytes(b[:3])))  # at most 3 bytes a call
    p = tmp_path / "state.json"
    data = bytes(range(256)) * 4
    files.atomic_write(str(p), data)
    assert p.read_bytes() == data


def test_the_file_is_synced_before_the_rename_and_the_directory_after(tmp_path, monkeypatch):
    steps = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        steps.append("fsync dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync file")
        real_fsync(fd)

    def replace(src, dst):
        steps.append("replace")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    files.atomic_write(str(tmp_path / "state.json"), b"x")
    assert steps == ["fsync file", "replace", "fsync dir"]


@pytest.mark.parametrize("where", ["write", "fsync", "replace"])
def test_a_failure_leaves_the_old_file_and_no_temp_file(tmp_path, monkeypatch, where):
    p = tmp_path / "state.json"
    p.write_bytes(b"old")
    os.chmod(p, 0o644)

    def fail(*a, **kw):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, where, fail)
    with pytest.raises(OSError) as e:
        files.atomic_write(str(p), b"new")
    monkeypatch.undo()
    assert e.value.errno == errno.ENOSPC  # the cause itself, not a cleanup's error
    assert p.read_bytes() == b"old" and mode_of(p) == 0o644
    assert sorted(os.listdir(tmp_path)) == ["state.json"]


def test_an_interrupt_mid_write_also_removes_the_temp_file(tmp_path, monkeypatch):
    def interrupted(fd, b):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "write", interrupted)
    p = tmp_path / "state.json"
    with pytest.raises(KeyboardInterrupt):
        files.atomic_write(str(p), b"new")
    monkeypatch.undo()
    assert os.listdir(tmp_path) == []


def test_a_missing_directory_is_an_error_and_creates_nothing(tmp_path):
    with pytest.raises(FileNotFoundError):
        files.atomic_write(str(tmp_path / "no" / "state.json"), b"x")
    assert os.listdir(tmp_path) == []


def test_a_crashs_leftover_temp_file_is_replaced_not_an_error(tmp_path):
    p = tmp_path / "state.json"
    with open(tmp_of(p), "wb") as f:
        f.write(b"torn half of an earlier write")
    files.atomic_write(str(p), b"whole")
    assert p.read_bytes() == b"whole"
    assert sorted(os.listdir(tmp_path)) == ["state.json"]


def test_a_symlink_at_the_temp_path_is_removed_and_its_target_left_alone(tmp_path):
    victim = tmp_path / "shadow"
    victim.write_bytes(b"precious")
    os.chmod(victim, 0o640)
    p = tmp_path / "options.l2tpd"
    os.symlink(victim, tmp_of(p))
    files.atomic_write(str(p), b"new", mode=0o644)
    assert victim.read_bytes() == b"precious" and mode_of(victim) == 0o640  # neither written nor chmodded
    assert p.read_bytes() == b"new" and not os.path.islink(p)
    assert not os.path.lexists(tmp_of(p))


def test_a_symlink_planted_after_the_leftover_is_removed_is_not_followed(tmp_path, monkeypatch):
    """The race O_EXCL|O_NOFOLLOW close: the link appears between the unlink
    of a leftover and the open of the temp file."""
    victim = tmp_path / "shadow"
    victim.write_bytes(b"precious")
    p = tmp_path / "state.json"
    p.write_bytes(b"old")
    real_unlink = os.unlink

    def unlink_then_plant(path, *a, **kw):
        try:
            real_unlink(path, *a, **kw)
        finally:
            if path == tmp_of(p) and not os.path.lexists(path):
                os.symlink(victim, path)

    monkeypatch.setattr(os, "unlink", unlink_then_plant)
    with pytest.raises(OSError):
        files.atomic_write(str(p), b"attacker's choice")
    monkeypatch.undo()
    assert victim.read_bytes() == b"precious"
    assert p.read_bytes() == b"old"
