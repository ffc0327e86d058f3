"""Exceptions raised by hetps: one class per status code.

Every error of a hetps call carries the server's (or the client's) message
and is an instance of ``hetps.Error`` and of the class of its status code.
Where a built-in exception means the same, the class derives from it too, so
``except ValueError`` catches a wrong dimension and ``except LookupError`` an
unknown table.
"""

from __future__ import annotations

__all__ = [
    "Error", "CancelledError", "InvalidArgumentError", "DeadlineExceededError",
    "NotFoundError", "AlreadyExistsError", "PermissionDeniedError",
    "ResourceExhaustedError", "FailedPreconditionError", "AbortedError",
    "OutOfRangeError", "UnimplementedError", "InternalError",
    "UnavailableError", "DataLossError", "UnauthenticatedError",
]


class Error(RuntimeError):
    """A hetps call failed. ``code`` names the status code."""

    code = "UNKNOWN"


class CancelledError(Error):
    code = "CANCELLED"


class InvalidArgumentError(Error, ValueError):
    """Malformed request: wrong dimension, NaN/Inf gradient, bad config."""

    code = "INVALID_ARGUMENT"


class DeadlineExceededError(Error, TimeoutError):
    code = "DEADLINE_EXCEEDED"


class NotFoundError(Error, LookupError):
    """Unknown table, missing data file."""

    code = "NOT_FOUND"


class AlreadyExistsError(Error):
    code = "ALREADY_EXISTS"


class PermissionDeniedError(Error, PermissionError):
    code = "PERMISSION_DENIED"


class ResourceExhaustedError(Error):
    """Too many keys in one request, a batch over the emulated memory."""

    code = "RESOURCE_EXHAUSTED"


class FailedPreconditionError(Error):
    """Wrong protocol or schema version, a worker id not in the job."""

    code = "FAILED_PRECONDITION"


class AbortedError(Error):
    code = "ABORTED"


class OutOfRangeError(Error, IndexError):
    code = "OUT_OF_RANGE"


class UnimplementedError(Error, NotImplementedError):
    code = "UNIMPLEMENTED"


class InternalError(Error):
    code = "INTERNAL"


class UnavailableError(Error, ConnectionError):
    """A server stayed unreachable past client.connect_deadline_s."""

    code = "UNAVAILABLE"


class DataLossError(Error):
    code = "DATA_LOSS"


class UnauthenticatedError(Error, PermissionError):
    code = "UNAUTHENTICATED"


BY_CODE = {
    cls.code: cls
    for cls in (
        Error,
        CancelledError,
        InvalidArgumentError,
        DeadlineExceededError,
        NotFoundError,
        AlreadyExistsError,
        PermissionDeniedError,
        ResourceExhaustedError,
        FailedPreconditionError,
        AbortedError,
        OutOfRangeError,
        UnimplementedError,
        InternalError,
        UnavailableError,
        DataLossError,
        UnauthenticatedError,
    )
}
"""The class of each status code name ("NOT_FOUND": NotFoundError)."""
