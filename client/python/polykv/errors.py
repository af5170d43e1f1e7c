"""Exceptions of polykv: one class per status code of the daemon's API.

Every failed call raises a subclass of :class:`Error`; the message is the
daemon's (or the client library's) own, e.g. ``ResourceExhausted("tenant
'a' is over its pool share: ...")``. Codes follow gRPC/absl.
"""

from __future__ import annotations


class Error(Exception):
    """A polykv call failed. ``code`` is the status code's name."""

    code = "UNKNOWN"

    @property
    def message(self) -> str:
        return str(self)


class Cancelled(Error):
    code = "CANCELLED"


class Unknown(Error):
    code = "UNKNOWN"


class InvalidArgument(Error):
    code = "INVALID_ARGUMENT"


class DeadlineExceeded(Error):
    code = "DEADLINE_EXCEEDED"


class NotFound(Error):
    code = "NOT_FOUND"


class AlreadyExists(Error):
    code = "ALREADY_EXISTS"


class PermissionDenied(Error):
    code = "PERMISSION_DENIED"


class ResourceExhausted(Error):
    """The pool, the tenant or the agent's QoS has no room: retry later or ask for less."""

    code = "RESOURCE_EXHAUSTED"


class FailedPrecondition(Error):
    """E.g. the daemon's epoch moved: sync first."""

    code = "FAILED_PRECONDITION"


class Aborted(Error):
    code = "ABORTED"


class OutOfRange(Error):
    code = "OUT_OF_RANGE"


class Unimplemented(Error):
    code = "UNIMPLEMENTED"


class Internal(Error):
    code = "INTERNAL"


class Unavailable(Error):
    """No daemon answers (or it is draining)."""

    code = "UNAVAILABLE"


class DataLoss(Error):
    code = "DATA_LOSS"


class Unauthenticated(Error):
    code = "UNAUTHENTICATED"


# By absl::StatusCode value (the gRPC codes), 1..16.
_BY_CODE = (None, Cancelled, Unknown, InvalidArgument, DeadlineExceeded, NotFound,
            AlreadyExists, PermissionDenied, ResourceExhausted, FailedPrecondition, Aborted,
            OutOfRange, Unimplemented, Internal, Unavailable, DataLoss, Unauthenticated)


def error_class(code: int) -> type[Error]:
    """The exception class of an absl/gRPC status code (Unknown for any other)."""
    if 0 < code < len(_BY_CODE):
        return _BY_CODE[code]
    return Unknown
