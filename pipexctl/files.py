"""Atomic replacement of a file in a private directory (the state file, the
discovery checkpoint): a crash leaves the old file or the new, never a torn one."""

from __future__ import annotations

import os


def atomic_write(path: str, data: bytes) -> None:
    """Temp file beside ``path`` (O_EXCL|O_NOFOLLOW, mode 0600), written
    whole, fsync, rename over ``path``, fsync the directory."""
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        os.unlink(tmp)  # a crash's leftover (unlink removes a symlink itself, never its target)
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(os.path.dirname(path) or ".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
