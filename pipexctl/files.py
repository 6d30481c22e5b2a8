"""Atomic replacement of a file (the state file, the discovery checkpoint,
pppd's options files): a crash leaves the old file or the new, never a torn one."""

from __future__ import annotations

import contextlib
import os


def atomic_write(path: str, data: bytes, mode: int = 0o600, keep_owner: bool = False, keep_open: bool = False) -> int:
    """Temp file beside ``path`` (O_EXCL|O_NOFOLLOW), written whole, fsync,
    rename over ``path``, fsync the directory.  The new file has ``mode``;
    with ``keep_owner`` an existing file's mode and owner carry over (an
    operator's pppd options file).  A failure before the rename leaves
    ``path`` as it was; one of the directory's fsync after it leaves the new
    file in place (it may not survive a crash); neither leaves a temp file.
    With ``keep_open`` it returns an fd of the new file (write-only, at its
    end; the state file appends to it), which the caller closes; else -1."""
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        os.unlink(tmp)  # a crash's leftover (unlink removes a symlink itself, never its target)
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    kept = -1
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            st = os.stat(path) if keep_owner and os.path.exists(path) else None
            if st is not None:
                os.fchown(fd, st.st_uid, st.st_gid)
            os.fchmod(fd, (st.st_mode & 0o7777) if st is not None else mode)  # exact, whatever the umask
            os.fsync(fd)
            if keep_open:
                kept = os.dup(fd)  # close-on-exec, like fd
        finally:
            os.close(fd)
        os.replace(tmp, path)
        dfd = os.open(os.path.dirname(path) or ".", os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except BaseException:
        if kept >= 0:
            os.close(kept)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return kept
