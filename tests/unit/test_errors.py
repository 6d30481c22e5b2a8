"""errors: the hierarchy and exit codes the CLI's boundary relies on, the
kernel errno turned into an operator's message, and the cleanup helpers
quietly and gone_ok."""

from __future__ import annotations

import errno
import logging

import pytest

from pipexctl import errors

LOG = logging.getLogger("pipexctl.test_errors")

SUBCLASSES = [errors.InvalidArgumentError, errors.KernelSupportError, errors.PermissionDeniedError,
              errors.NotFoundError, errors.AlreadyExistsError, errors.ConflictError, errors.KernelError,
              errors.ChannelNotTakenError, errors.SocketError]


@pytest.mark.parametrize("cls", SUBCLASSES)
def test_every_error_is_a_pipex_error_caught_at_the_boundary(cls):
    e = cls("tunnel 10: it does not exist", errno=errno.ENOENT)
    assert isinstance(e, errors.PipexError) and isinstance(e, Exception)
    assert str(e) == "tunnel 10: it does not exist"  # the CLI prints str(error) as its one line
    assert e.errno == errno.ENOENT


def test_a_usage_error_exits_2_every_other_error_1():
    assert errors.InvalidArgumentError.exit_code == 2
    assert {cls.exit_code for cls in SUBCLASSES if cls is not errors.InvalidArgumentError} == {1}
    assert errors.PipexError("x").exit_code == 1 and errors.PipexError("x").errno is None


@pytest.mark.parametrize("code, cls, words", [
    (errno.EEXIST, errors.AlreadyExistsError, "tunnel 10 already exists"),
    (errno.ENOENT, errors.NotFoundError, "cannot delete tunnel 10: it does not exist"),
    (errno.ENODEV, errors.NotFoundError, "it does not exist"),
    (errno.EPERM, errors.PermissionDeniedError, "CAP_NET_ADMIN"),
    (errno.EACCES, errors.PermissionDeniedError, "permission denied"),
    (errno.EBUSY, errors.ConflictError, "EBUSY"),
    (errno.EPROTONOSUPPORT, errors.KernelSupportError, "modprobe"),
    (errno.EPROTOTYPE, errors.ConflictError, "another pseudowire type"),
    (errno.EBADF, errors.SocketError, "bad socket file descriptor"),
    (errno.EINVAL, errors.InvalidArgumentError, "EINVAL"),
    (errno.EADDRINUSE, errors.ConflictError, "address already in use"),
    (errno.EADDRNOTAVAIL, errors.InvalidArgumentError, "not configured here"),
    (errno.ENOMEM, errors.KernelError, "cannot delete tunnel 10: ENOMEM (Cannot allocate memory)"),
])
def test_from_errno_names_the_object_and_the_cause(code, cls, words):
    for c in (code, -code):  # netlink answers a negative errno
        e = errors.from_errno(c, "tunnel 10", "delete")
        assert type(e) is cls and e.errno == code
        assert words in str(e)


def test_from_errno_of_an_unnamed_code_still_says_the_number():
    e = errors.from_errno(4000, "session 5 in tunnel 10", "create")
    assert type(e) is errors.KernelError and e.errno == 4000
    assert str(e).startswith("cannot create session 5 in tunnel 10: 4000 (")


def raises(exc):
    def fn():
        raise exc
    return fn


def test_gone_ok_takes_not_found_as_success_without_a_word(caplog):
    caplog.set_level(logging.DEBUG, LOG.name)
    errors.gone_ok(raises(errors.NotFoundError("session 5 in tunnel 10: it does not exist")), LOG)
    assert caplog.records == []


def test_gone_ok_logs_any_other_pipex_error_as_a_warning(caplog):
    caplog.set_level(logging.DEBUG, LOG.name)
    errors.gone_ok(raises(errors.PermissionDeniedError("cannot delete tunnel 10: permission denied")), LOG)
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "cannot delete tunnel 10: permission denied")]


def test_gone_ok_and_quietly_without_a_log_say_nothing(caplog):
    caplog.set_level(logging.DEBUG)
    errors.gone_ok(raises(errors.KernelError("cannot delete tunnel 10: EIO")))
    errors.quietly(raises(errors.KernelError("cannot delete tunnel 10: EIO")))
    assert caplog.records == []


@pytest.mark.parametrize("helper", [errors.gone_ok, errors.quietly])
@pytest.mark.parametrize("exc", [OSError(errno.EIO, "I/O error"), ValueError("a bug"), KeyboardInterrupt()])
def test_a_non_pipex_error_goes_through_both_helpers(helper, exc):
    with pytest.raises(type(exc)):
        helper(raises(exc), LOG)


def test_quietly_logs_even_not_found(caplog):
    caplog.set_level(logging.DEBUG, LOG.name)
    errors.quietly(raises(errors.NotFoundError("tunnel 10: it does not exist")), LOG)
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "tunnel 10: it does not exist")]


def test_both_helpers_run_fn_and_return_none_on_success():
    ran = []
    assert errors.quietly(lambda: ran.append("q"), LOG) is None
    assert errors.gone_ok(lambda: ran.append("g") or "ignored", LOG) is None
    assert ran == ["q", "g"]
