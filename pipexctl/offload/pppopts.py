"""Turn the offload on or off in xl2tpd's pppd options files.

xl2tpd starts pppd with ``file <pppoptfile>`` from each [lns]/[lac]
section of xl2tpd.conf; the plugin is loaded from there.  pipexctl owns one
marked block in each such file and never touches a line outside it, so the
change is idempotent and reversible (the Ansible module and operators by
hand use the same functions).
"""

from __future__ import annotations

import errno
import re
from dataclasses import dataclass
from typing import Optional

from .. import defaults, errors, files

BEGIN = "# BEGIN pipexctl (managed: pipexctl offload; edit the role/module, not these lines)"
END = "# END pipexctl"

_BLOCK = re.compile(r"^# BEGIN pipexctl.*?\n.*?^# END pipexctl[^\n]*\n?", re.M | re.S)


def block(plugin: str = "pipexctl.so", socket: str = defaults.SERVE_SOCKET, required: bool = False,
          timeout: Optional[int] = None, move: Optional[int] = None) -> str:
    """The lines that load the plugin (option names: plugins/pipexctl.c)."""
    for what, v in (("plugin", plugin), ("socket", socket)):
        if not v or any(c in v for c in " \t\n#\"'"):
            raise ValueError(f"bad {what} path {v!r}: no spaces, quotes or '#'")
    if timeout is not None and not 1 <= timeout <= 60:  # the plugin's own bound (OPT_LIMITS)
        raise ValueError(f"timeout {timeout} out of range 1..60 seconds")
    if move is not None and not 0 <= move <= 3600:
        raise ValueError(f"move {move} out of range 0..3600 seconds")
    lines = [BEGIN, f"plugin {plugin}", f"pipexctl_socket {socket}"]
    if timeout is not None:
        lines.append(f"pipexctl_timeout {timeout}")
    if move is not None:
        lines.append(f"pipexctl_move {move}")
    if required:
        lines.append("pipexctl_required")
    return "\n".join(lines + [END]) + "\n"


def current(text: str) -> Optional[str]:
    """pipexctl's block in an options file, or None."""
    m = _BLOCK.search(text)
    return m.group(0) if m else None


def apply(text: str, want: Optional[str]) -> str:
    """``text`` with pipexctl's block replaced by ``want`` (None: removed).

    Refuses a file that loads another copy of the plugin outside the block,
    or pppol2tp.so (xl2tpd's kernel mode is then already in use)."""
    begins = len(re.findall(r"^# BEGIN pipexctl", text, re.M))
    ends = len(re.findall(r"^# END pipexctl", text, re.M))
    if begins > 1 or begins != ends or (begins and not _BLOCK.search(text)):
        # an edited block: removing "from BEGIN on" could take the user's own lines
        raise ValueError(f"pipexctl's block is damaged ({begins} BEGIN and {ends} END lines): "
                         "repair or remove it by hand first")
    outside = _BLOCK.sub("", text)
    for line in outside.splitlines():
        words = line.split("#", 1)[0].split()
        if len(words) >= 2 and words[0] == "plugin" and words[1].endswith(("pipexctl.so", "pppol2tp.so")):
            raise ValueError(f"the file already loads {words[1]} outside pipexctl's block: remove that line first")
    if want is None:
        return outside
    if _BLOCK.search(text):
        return _BLOCK.sub(lambda _: want, text, count=1)
    return text + ("" if not text or text.endswith("\n") else "\n") + want


def option_files(xl2tpd_conf: str) -> list[str]:
    """The ``pppoptfile`` of every section of an xl2tpd.conf text, in order, once each."""
    out: list[str] = []
    for line in xl2tpd_conf.splitlines():
        m = re.match(r"\s*pppoptfile\s*=\s*(\S+)", line.split(";", 1)[0])
        if m and m.group(1) not in out:
            out.append(m.group(1))
    return out


@dataclass
class Change:
    path: str
    before: str
    after: str


def files_of(xl2tpd_conf: str) -> list[str]:
    """The pppoptfiles xl2tpd.conf names; a clear error when none or unreadable."""
    try:
        with open(xl2tpd_conf) as f:
            files = option_files(f.read())
    except OSError as e:
        raise errors.InvalidArgumentError(f"cannot read {xl2tpd_conf}: {e.strerror}") from None
    if not files:
        raise errors.InvalidArgumentError(f"{xl2tpd_conf} names no pppoptfile: give the options files")
    return files


def manage(files: list[str], want: Optional[str], write: bool = True) -> list[Change]:
    """Put ``want`` (None: no block) in each file; the files that change.

    All files are read and checked before any is written: a refused file
    (it loads a plugin outside the block, or the block is damaged) leaves
    every file as it was.  Writes keep each file's mode and owner and are
    atomic (files.atomic_write)."""
    changes = []
    for path in files:
        try:
            with open(path) as f:
                old = f.read()
        except FileNotFoundError:
            old = ""
        except OSError as e:
            raise errors.InvalidArgumentError(f"cannot read {path}: {e.strerror}") from None
        try:
            new = apply(old, want)
        except ValueError as e:
            raise errors.ConflictError(f"{path}: {e}") from None
        if new != old:
            changes.append(Change(path, old, new))
    if write:
        for c in changes:
            _write(c.path, c.after)
    return changes


def _write(path: str, text: str) -> None:
    try:
        files.atomic_write(path, text.encode(), mode=0o644, keep_owner=True)
    except OSError as e:
        # a path that cannot name a file is a usage error (exit 2); a full or read-only disk is not (exit 1)
        kind = (errors.PermissionDeniedError if e.errno in (errno.EACCES, errno.EPERM)
                else errors.InvalidArgumentError if e.errno in (errno.ENOENT, errno.ENOTDIR, errno.EISDIR)
                else errors.PipexError)
        raise kind(f"cannot write {path}: {e.strerror}") from None
