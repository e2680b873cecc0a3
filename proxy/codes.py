"""RocketMQ v2 `Code` values for raftmq's typed errors, in one table, and the proxy's own error.

Pure. Every status the proxy sends carries a message a person understands; a failure that is no
RaftMQError (a bug) becomes INTERNAL_SERVER_ERROR with a short text, never a traceback.
"""

from __future__ import annotations

from raftmq.common.errors import (
    BrokerUnavailableError,
    InternalError,
    InvalidArgumentError,
    InvalidDelayError,
    InvalidFilterError,
    InvalidMessageError,
    InvalidMessageIdError,
    InvalidNameError,
    MessageNotFoundError,
    MessageTooLargeError,
    NoRouteError,
    NotLeaderError,
    OffsetOutOfRangeError,
    OutcomeUnknownError,
    PermissionDeniedError,
    QueueFullError,
    RaftMQError,
    RequestTimeoutError,
    ThrottledError,
    TopicNotFoundError,
    TransactionConflictError,
    TransactionNotFoundError,
    UnauthenticatedError,
    UnsupportedError,
)
from raftmq.common.pb.apache.rocketmq.v2 import definition_pb2 as v2

Code = int  # a definition_pb2.Code value

# Most specific class first: the first row whose class the error is an instance of wins.
_TABLE: tuple[tuple[type[RaftMQError], Code], ...] = (
    (MessageTooLargeError, v2.MESSAGE_BODY_TOO_LARGE),
    (InvalidFilterError, v2.ILLEGAL_FILTER_EXPRESSION),
    (InvalidMessageIdError, v2.ILLEGAL_MESSAGE_ID),
    (InvalidDelayError, v2.ILLEGAL_DELIVERY_TIME),
    (InvalidNameError, v2.BAD_REQUEST),
    (InvalidMessageError, v2.BAD_REQUEST),
    (InvalidArgumentError, v2.BAD_REQUEST),
    (TopicNotFoundError, v2.TOPIC_NOT_FOUND),
    (NoRouteError, v2.TOPIC_NOT_FOUND),
    (PermissionDeniedError, v2.FORBIDDEN),
    (UnauthenticatedError, v2.UNAUTHORIZED),
    (OffsetOutOfRangeError, v2.ILLEGAL_OFFSET),
    (MessageNotFoundError, v2.MESSAGE_NOT_FOUND),
    (UnsupportedError, v2.UNSUPPORTED),
    (TransactionNotFoundError, v2.INVALID_TRANSACTION_ID),
    (TransactionConflictError, v2.PRECONDITION_FAILED),
    (NotLeaderError, v2.HA_NOT_AVAILABLE),
    (BrokerUnavailableError, v2.HA_NOT_AVAILABLE),
    (RequestTimeoutError, v2.PROXY_TIMEOUT),
    (QueueFullError, v2.TOO_MANY_REQUESTS),
    (ThrottledError, v2.TOO_MANY_REQUESTS),
    # The message may be stored: RocketMQ says so with its flush-timeout code.
    (OutcomeUnknownError, v2.MASTER_PERSISTENCE_TIMEOUT),
    (InternalError, v2.INTERNAL_SERVER_ERROR),
)


class ApiError(Exception):
    """A request the proxy answers with a v2 status other than OK (its own checks: names,
    durations, receipt handles, message types)."""

    def __init__(self, code: Code, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def code_for(err: RaftMQError) -> Code:
    for klass, code in _TABLE:
        if isinstance(err, klass):
            return code
    return v2.INTERNAL_SERVER_ERROR


def status_of(exc: BaseException) -> v2.Status:
    """The v2 status that answers a failure."""
    if isinstance(exc, ApiError):
        return v2.Status(code=exc.code, message=exc.message)  # type: ignore[arg-type]
    if isinstance(exc, RaftMQError):
        return v2.Status(code=code_for(exc), message=exc.message)  # type: ignore[arg-type]
    return v2.Status(
        code=v2.INTERNAL_SERVER_ERROR,
        message=f"the proxy failed to serve the request ({type(exc).__name__}); its log has "
        "the details",
    )


def ok(message: str = "OK") -> v2.Status:
    return v2.Status(code=v2.OK, message=message)
