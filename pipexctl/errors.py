"""One error hierarchy for the whole library.

Every error carries a message written for an operator: it names the object
and the cause.  The CLI prints ``str(error)`` as its single error line and
exits with ``error.exit_code``.
"""

from __future__ import annotations

import errno as _errno
import logging
import os
from typing import Callable, Optional


class PipexError(Exception):
    """Base of every error pipexctl raises on purpose."""

    exit_code = 1

    def __init__(self, message: str, *, errno: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno


class InvalidArgumentError(PipexError):
    """A value is out of range or inconsistent (a usage error)."""

    exit_code = 2


class KernelSupportError(PipexError):
    """The running kernel lacks a module or feature pipexctl needs."""


class PermissionDeniedError(PipexError):
    """The operation needs CAP_NET_ADMIN (root) in this network namespace."""


class NotFoundError(PipexError):
    """A tunnel or session does not exist."""


class AlreadyExistsError(PipexError):
    """A tunnel or session with that id already exists."""


class ConflictError(PipexError):
    """The object exists but with other parameters, or is in use."""


class KernelError(PipexError):
    """Any other error the kernel returned."""


class ChannelNotTakenError(PipexError):
    """pppd did not acknowledge the channel it was sent (it gave up waiting,
    or refused the sockets): the offload is undone."""


class SocketError(PipexError):
    """A socket (UDP, PPPoL2TP, unix hand-off) operation failed."""


# what "it does not exist" is in the kernel's answers: the l2tp family
# answers ENODEV for an unknown tunnel or session
NOT_FOUND = frozenset({_errno.ENOENT, _errno.ENODEV})


def from_errno(code: int, what: str, action: str) -> PipexError:
    """Turn a kernel errno for ``action`` on ``what`` into an operator message.

    ``what`` names the object ("tunnel 10", "session 5 in tunnel 10");
    ``action`` is a verb phrase ("create", "delete", "connect PPPoL2TP socket to").
    """
    code = abs(code)
    if code == _errno.EEXIST:
        return AlreadyExistsError(f"{what} already exists", errno=code)
    if code in NOT_FOUND:
        return NotFoundError(f"cannot {action} {what}: it does not exist", errno=code)
    if code in (_errno.EPERM, _errno.EACCES):
        return PermissionDeniedError(
            f"cannot {action} {what}: permission denied (needs CAP_NET_ADMIN, run as root)", errno=code
        )
    if code == _errno.EBUSY:
        return ConflictError(f"cannot {action} {what}: socket already carries a tunnel (EBUSY)", errno=code)
    if code == _errno.EPROTONOSUPPORT:
        return KernelSupportError(
            f"cannot {action} {what}: the kernel has no support for this pseudowire/encapsulation "
            "(modprobe l2tp_eth, l2tp_ppp or l2tp_ip/l2tp_ip6)",
            errno=code,
        )
    if code == _errno.EPROTOTYPE:
        return ConflictError(f"cannot {action} {what}: it exists with another pseudowire type", errno=code)
    if code == _errno.EBADF:
        return SocketError(f"cannot {action} {what}: bad socket file descriptor", errno=code)
    if code == _errno.EINVAL:
        return InvalidArgumentError(f"cannot {action} {what}: the kernel rejected the parameters (EINVAL)", errno=code)
    if code == _errno.EADDRINUSE:
        return ConflictError(f"cannot {action} {what}: address already in use", errno=code)
    if code == _errno.EADDRNOTAVAIL:
        return InvalidArgumentError(f"cannot {action} {what}: local address is not configured here", errno=code)
    return KernelError(f"cannot {action} {what}: {_errno.errorcode.get(code, code)} ({os.strerror(code)})", errno=code)


def quietly(fn: Callable[[], object], log: Optional[logging.Logger] = None) -> None:
    """Run ``fn`` for its effect on a cleanup path: a PipexError does not
    stop the cleanup; it is logged as a warning on ``log`` (if given)."""
    try:
        fn()
    except PipexError as e:
        if log is not None:
            log.warning("%s", e)


def gone_ok(fn: Callable[[], object], log: Optional[logging.Logger] = None) -> None:
    """Delete something that may already be gone (with its pppd or socket):
    NotFoundError is success; any other PipexError is logged, as ``quietly``."""
    try:
        fn()
    except NotFoundError:
        pass
    except PipexError as e:
        if log is not None:
            log.warning("%s", e)
