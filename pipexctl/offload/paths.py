"""The daemon's directories: made private, or refused when others could write.

The socket and the state file live where root alone may create and replace
files.  A directory the daemon makes itself is 0700; an existing one (/run,
an operator's choice) keeps its mode -- the daemon never chmods what it did
not create -- and is refused when it is not owned by the daemon's user or
is writable by group or others (/tmp: anyone could swap the socket or the
state file for their own).
"""

from __future__ import annotations

import os
import stat

from .. import errors


def _make(d: str) -> None:
    """``d`` and each missing parent, 0700 (os.makedirs gives parents 0777 & ~umask)."""
    try:
        os.mkdir(d, 0o700)
    except FileExistsError:
        pass
    except FileNotFoundError:
        parent = os.path.dirname(os.path.abspath(d))
        if parent == os.path.abspath(d):
            raise
        _make(parent)
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:  # made meanwhile by someone else: checked below like any existing one
            pass


def private_dir(d: str, what: str) -> None:
    d = d or "."
    _make(d)
    st = os.lstat(d)
    if not stat.S_ISDIR(st.st_mode):
        raise errors.PermissionDeniedError(f"{what} directory {d} is not a directory (a symlink?)")
    if st.st_uid != os.geteuid():
        raise errors.PermissionDeniedError(f"{what} directory {d} is owned by uid {st.st_uid}, not by this "
                                           f"daemon's uid {os.geteuid()}: refused")
    if st.st_mode & 0o022:
        raise errors.PermissionDeniedError(f"{what} directory {d} is writable by group or others "
                                           f"(mode {stat.S_IMODE(st.st_mode):o}): refused, use e.g. /run/pipexctl")
