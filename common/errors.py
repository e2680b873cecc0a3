"""The error table: every raftmq failure as a typed exception, one gRPC status and one stable code.

Servers raise these and `rpc_errors` / `abort_with` put them on the wire (status + ErrorDetail in
trailing metadata); clients turn any `grpc.RpcError` back into one with `from_rpc_error`.
Each error says whose fault it is (`Fault.CALLER`: fix the request; `Fault.SYSTEM`: retry).
Nothing here sends a traceback to a peer.
"""

from __future__ import annotations

import enum
import functools
import logging
import re
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import NoReturn, TypeVar

import grpc

from raftmq.common.pb import common_pb2

_log = logging.getLogger(__name__)

# Trailing-metadata key carrying a serialized common_pb2.ErrorDetail (binary keys end in -bin).
ERROR_DETAIL_KEY = "raftmq-error-bin"
# gRPC status details travel in HTTP/2 trailers; keep ours far below common header limits.
MAX_MESSAGE_CHARS = 1024


class Fault(enum.Enum):
    """Whose fault a failure is."""

    CALLER = "caller"  # fix the request; retrying it unchanged fails the same way
    SYSTEM = "system"  # the cluster could not serve it now; retrying (maybe elsewhere) may succeed


class RaftMQError(Exception):
    """Base of every raftmq SDK and server error.

    `message` says what happened and what to do next; `leader_hint` is a gRPC "host:port" (only
    NOT_LEADER sets it); `details` holds structured context that survives the wire.
    """

    def __init__(
        self,
        message: str,
        *,
        leader_hint: str = "",
        details: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.leader_hint = leader_hint
        self.details: dict[str, str] = dict(details or {})

    @property
    def code(self) -> str:
        return row_for(type(self)).code

    @property
    def fault(self) -> Fault:
        return row_for(type(self)).fault

    @property
    def retryable(self) -> bool:
        return row_for(type(self)).retryable

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r})"


# ---- the caller's fault -------------------------------------------------------------------------


class InvalidArgumentError(RaftMQError):
    """A request field is missing, malformed or out of its allowed range."""


class InvalidNameError(InvalidArgumentError):
    """A topic, group, cluster or node name breaks the naming rules."""

    @classmethod
    def for_name(cls, kind: str, name: str, rule: str) -> InvalidNameError:
        return cls(
            f"{kind} name {name!r} is invalid: {rule}",
            details={"kind": kind, "name": name},
        )


class InvalidMessageError(InvalidArgumentError):
    """A message breaks a rule (size, properties, tag, keys); the text says which and the limit."""


class InvalidFilterError(InvalidArgumentError):
    """A tag or SQL92 filter expression that does not parse; the text gives the position and the
    fix."""


class InvalidMessageIdError(InvalidArgumentError):
    """A string that is not a raftmq message id."""


class InvalidTopicConfigError(InvalidArgumentError):
    """A topic configuration outside the allowed ranges (queue counts, permission bits)."""


class MessageTooLargeError(InvalidArgumentError):
    """A message (or batch) is larger than the broker accepts."""

    @classmethod
    def for_size(cls, size_bytes: int, max_bytes: int) -> MessageTooLargeError:
        return cls(
            f"message of {size_bytes} bytes exceeds the limit of {max_bytes} bytes; "
            "split the batch, compress the body, or raise max_message_bytes on every broker",
            details={"size_bytes": str(size_bytes), "max_bytes": str(max_bytes)},
        )


class TopicNotFoundError(RaftMQError):
    """The topic does not exist on this broker group."""

    @classmethod
    def for_topic(cls, topic: str, *, auto_create: bool = False) -> TopicNotFoundError:
        why = "" if auto_create else " and auto-create is off"
        return cls(
            f"topic {topic!r} does not exist{why}; create it with `raftmq topic create {topic}`",
            details={"topic": topic},
        )


class TopicAlreadyExistsError(RaftMQError):
    """CreateTopic named a topic that exists already."""

    @classmethod
    def for_topic(cls, topic: str) -> TopicAlreadyExistsError:
        return cls(
            f"topic {topic!r} already exists; change it with `raftmq topic update {topic}`",
            details={"topic": topic},
        )


class PermissionDeniedError(RaftMQError):
    """The topic's permission forbids this operation (read-only, write-only or none)."""

    @classmethod
    def for_topic(cls, topic: str, operation: str, perm: str) -> PermissionDeniedError:
        return cls(
            f"topic {topic!r} does not allow {operation} (permission {perm}); change it with "
            f"`raftmq topic update {topic} --perm rw`",
            details={"topic": topic, "operation": operation, "perm": perm},
        )


class AccessDeniedError(PermissionDeniedError):
    """The ACL (users and policies, `raftmq acl`) does not allow this user this action on this
    resource. A PermissionDeniedError, so code that handles a topic's permission handles it.
    Its details say why (`reason`: deny, no_allow, unknown_user) and the command that grants it
    (`grant`); common/auth_guard.py `denial` makes them."""

    @property
    def reason(self) -> str:
        return self.details.get("reason", "")

    @property
    def grant(self) -> str:
        return self.details.get("grant", "")


class ConsumeDisabledError(PermissionDeniedError):
    """The consumer group's config (`raftmq group config`) turns consuming off, or broadcast
    for a consumer in broadcasting mode: every pull of the group is refused until an admin turns
    it on again. A PermissionDeniedError, as RocketMQ answers NO_PERMISSION."""

    @classmethod
    def for_group(cls, group: str, *, broadcast: bool = False) -> ConsumeDisabledError:
        what, flag = ("by broadcast", "--broadcast on") if broadcast else ("", "--consume on")
        return cls(
            f"consumer group {group!r} may not consume{' ' + what if what else ''}: its config "
            f"turns it off; turn it on with `raftmq group config {group} {flag}`",
            details={"consumer_group": group, "switch": "broadcast" if broadcast else "consume"},
        )


class UnauthenticatedError(RaftMQError):
    """The request carries no valid signature: missing credentials, an unknown access key, a
    signature that does not match, or a signing time outside the server's window (a replay)."""


class OffsetOutOfRangeError(RaftMQError):
    """An offset lies outside [min_offset, max_offset] of its queue."""

    deleted_by_retention = False  # True on DeletedByRetentionError: below min, retention's doing

    @classmethod
    def for_offset(
        cls, topic: str, queue_id: int, offset: int, min_offset: int, max_offset: int
    ) -> OffsetOutOfRangeError:
        return cls(
            f"offset {offset} of {topic}/{queue_id} is outside [{min_offset}, {max_offset}]; "
            "seek to a bound (earliest or latest) or reset the group's offsets by timestamp",
            details={
                "topic": topic,
                "queue_id": str(queue_id),
                "offset": str(offset),
                "min_offset": str(min_offset),
                "max_offset": str(max_offset),
            },
        )

    @property
    def min_offset(self) -> int | None:
        return _int_detail(self.details, "min_offset")

    @property
    def max_offset(self) -> int | None:
        return _int_detail(self.details, "max_offset")


class DeletedByRetentionError(OffsetOutOfRangeError):
    """The offset lies below the queue's min offset: retention deleted those messages. A
    consumer catching it knows exactly how many it lost (`lost_messages`)."""

    deleted_by_retention = True

    @classmethod
    def for_offset(
        cls, topic: str, queue_id: int, offset: int, min_offset: int, max_offset: int
    ) -> DeletedByRetentionError:
        lost = min_offset - offset
        return cls(
            f"offset {offset} of {topic}/{queue_id} was deleted by retention: the queue now "
            f"starts at {min_offset}, so {lost} messages were lost unconsumed; continue from "
            f"{min_offset} (raise retention_ms or retention_bytes if consumers fall this far "
            "behind)",
            details={
                "topic": topic,
                "queue_id": str(queue_id),
                "offset": str(offset),
                "min_offset": str(min_offset),
                "max_offset": str(max_offset),
                "lost_messages": str(lost),
            },
        )

    @property
    def lost_messages(self) -> int | None:
        return _int_detail(self.details, "lost_messages")


class MessageNotFoundError(RaftMQError):
    """No stored message has this id (or it was deleted by retention)."""

    @classmethod
    def for_id(cls, msg_id: str) -> MessageNotFoundError:
        return cls(
            f"no message with id {msg_id!r}; it may have been deleted by retention, or the id "
            "belongs to another broker group",
            details={"msg_id": msg_id},
        )


class UnsupportedError(RaftMQError):
    """The server does not implement the call or option."""


class InvalidDelayError(InvalidArgumentError):
    """A delay level, delay or delivery time outside the allowed range; the text gives the range."""


class TransactionNotFoundError(RaftMQError):
    """No half message has this transaction id (never stored, or ended and forgotten)."""

    @classmethod
    def for_id(cls, transaction_id: str) -> TransactionNotFoundError:
        return cls(
            f"no transaction with id {transaction_id!r}: no half message was stored under it, "
            "or it ended long enough ago to be forgotten; check the id the send returned",
            details={"transaction_id": transaction_id},
        )


class TransactionConflictError(RaftMQError):
    """The transaction already ended the other way (a commit after a rollback or the reverse)."""

    @classmethod
    def for_end(cls, transaction_id: str, state: str, wanted: str) -> TransactionConflictError:
        return cls(
            f"transaction {transaction_id!r} is already {state}; it cannot be {wanted} now "
            "(an ended transaction never changes its outcome)",
            details={"transaction_id": transaction_id, "state": state, "wanted": wanted},
        )


class TraceNotFoundError(RaftMQError):
    """No trace record names this message id (not traced, not yet flushed, or expired)."""

    @classmethod
    def for_id(cls, msg_id: str) -> TraceNotFoundError:
        return cls(
            f"no trace of message {msg_id!r}: it was sent and consumed without trace=True, its "
            "trace records are not flushed yet (they go out within a second), or they are older "
            "than the trace topic's retention",
            details={"msg_id": msg_id},
        )


# ---- the system's fault -------------------------------------------------------------------------


class NotLeaderError(RaftMQError):
    """This node is not its group's leader; retry on `leader_hint` (or refresh routes if empty)."""

    @classmethod
    def for_node(cls, node_id: str, broker_group: str, leader_hint: str) -> NotLeaderError:
        where = (
            f"the leader is at {leader_hint}; retry there"
            if leader_hint
            else "no leader is known yet (an election is under way, or most of its nodes are "
            "down: `raftmq cluster status` shows them); refresh routes and retry shortly"
        )
        return cls(
            f"node {node_id} of broker group {broker_group} is not the leader: {where}",
            leader_hint=leader_hint,
            details={"node_id": node_id, "broker_group": broker_group},
        )


class NoRouteError(RaftMQError):
    """No NameServer knows a broker group serving the topic."""

    @classmethod
    def for_topic(cls, topic: str, namesrv_addresses: Iterable[str] = ()) -> NoRouteError:
        where = ", ".join(namesrv_addresses) or "the NameServer"
        return cls(
            f"no broker group serving topic {topic!r} is registered with {where}; check that the "
            f"topic exists (`raftmq topic list`) and that its brokers are running",
            details={"topic": topic},
        )


class BrokerUnavailableError(RaftMQError):
    """The server could not be reached or is shutting down; retry, possibly on another node."""


class RequestTimeoutError(RaftMQError):
    """The deadline passed before an answer; for writes the outcome may be unknown."""


class QueueFullError(RaftMQError):
    """The broker's pending-write queue is full; back off and retry."""


class ThrottledError(RaftMQError):
    """The broker is refusing work for now (flow control, disk guard); back off and retry."""

    @property
    def retry_after_ms(self) -> int | None:
        return _int_detail(self.details, "retry_after_ms")


class DiskPressureError(ThrottledError):
    """The broker's disk passed its pressure threshold: sends are refused (nothing was stored)
    until retention frees space; offsets and reads go on."""


class OutcomeUnknownError(RaftMQError):
    """The write may or may not have been stored (leadership changed in flight).

    Retry only with the idempotent producer (producer id + sequence), never blindly.
    """


class OutOfOrderSequenceError(RaftMQError):
    """An idempotent batch arrived before an earlier batch of its queue (several in flight, one
    being retried): not stored; retry it after the earlier one. The SDK does this itself."""


class InternalError(RaftMQError):
    """A bug or invariant violation on the server; the server log holds the details."""


# ---- the table ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ErrorRow:
    exc: type[RaftMQError]
    status: grpc.StatusCode
    code: str  # the common_pb2.ErrorCode value name: stable across releases
    fault: Fault
    retryable: bool


_C, _S = Fault.CALLER, Fault.SYSTEM
_SC = grpc.StatusCode

ERROR_TABLE: tuple[ErrorRow, ...] = (
    ErrorRow(InvalidArgumentError, _SC.INVALID_ARGUMENT, "INVALID_ARGUMENT", _C, False),
    ErrorRow(InvalidNameError, _SC.INVALID_ARGUMENT, "INVALID_NAME", _C, False),
    ErrorRow(InvalidMessageError, _SC.INVALID_ARGUMENT, "INVALID_MESSAGE", _C, False),
    ErrorRow(InvalidMessageIdError, _SC.INVALID_ARGUMENT, "INVALID_MESSAGE_ID", _C, False),
    ErrorRow(InvalidTopicConfigError, _SC.INVALID_ARGUMENT, "INVALID_TOPIC_CONFIG", _C, False),
    ErrorRow(InvalidFilterError, _SC.INVALID_ARGUMENT, "INVALID_FILTER", _C, False),
    ErrorRow(MessageTooLargeError, _SC.INVALID_ARGUMENT, "MESSAGE_TOO_LARGE", _C, False),
    ErrorRow(TopicNotFoundError, _SC.NOT_FOUND, "TOPIC_NOT_FOUND", _C, False),
    ErrorRow(TopicAlreadyExistsError, _SC.ALREADY_EXISTS, "TOPIC_ALREADY_EXISTS", _C, False),
    ErrorRow(PermissionDeniedError, _SC.PERMISSION_DENIED, "PERMISSION_DENIED", _C, False),
    ErrorRow(AccessDeniedError, _SC.PERMISSION_DENIED, "ACCESS_DENIED", _C, False),
    ErrorRow(ConsumeDisabledError, _SC.PERMISSION_DENIED, "CONSUME_DISABLED", _C, False),
    ErrorRow(UnauthenticatedError, _SC.UNAUTHENTICATED, "UNAUTHENTICATED", _C, False),
    ErrorRow(OffsetOutOfRangeError, _SC.OUT_OF_RANGE, "OFFSET_OUT_OF_RANGE", _C, False),
    ErrorRow(MessageNotFoundError, _SC.NOT_FOUND, "MESSAGE_NOT_FOUND", _C, False),
    ErrorRow(UnsupportedError, _SC.UNIMPLEMENTED, "UNSUPPORTED", _C, False),
    ErrorRow(InvalidDelayError, _SC.INVALID_ARGUMENT, "INVALID_DELAY", _C, False),
    ErrorRow(TransactionNotFoundError, _SC.NOT_FOUND, "TRANSACTION_NOT_FOUND", _C, False),
    ErrorRow(TransactionConflictError, _SC.FAILED_PRECONDITION, "TRANSACTION_CONFLICT", _C, False),
    ErrorRow(TraceNotFoundError, _SC.NOT_FOUND, "TRACE_NOT_FOUND", _C, False),
    ErrorRow(NotLeaderError, _SC.UNAVAILABLE, "NOT_LEADER", _S, True),
    ErrorRow(NoRouteError, _SC.NOT_FOUND, "NO_ROUTE", _S, True),
    ErrorRow(BrokerUnavailableError, _SC.UNAVAILABLE, "BROKER_UNAVAILABLE", _S, True),
    ErrorRow(RequestTimeoutError, _SC.DEADLINE_EXCEEDED, "REQUEST_TIMEOUT", _S, True),
    ErrorRow(QueueFullError, _SC.RESOURCE_EXHAUSTED, "QUEUE_FULL", _S, True),
    ErrorRow(ThrottledError, _SC.RESOURCE_EXHAUSTED, "THROTTLED", _S, True),
    ErrorRow(OutcomeUnknownError, _SC.UNKNOWN, "OUTCOME_UNKNOWN", _S, False),
    ErrorRow(InternalError, _SC.INTERNAL, "INTERNAL", _S, False),
    ErrorRow(DeletedByRetentionError, _SC.OUT_OF_RANGE, "DELETED_BY_RETENTION", _C, False),
    ErrorRow(DiskPressureError, _SC.RESOURCE_EXHAUSTED, "DISK_PRESSURE", _S, True),
    ErrorRow(OutOfOrderSequenceError, _SC.ABORTED, "OUT_OF_ORDER_SEQUENCE", _S, True),
)

_BY_CLASS: dict[type[RaftMQError], ErrorRow] = {row.exc: row for row in ERROR_TABLE}
_BY_CODE: dict[str, ErrorRow] = {row.code: row for row in ERROR_TABLE}

# A status that arrives without our ErrorDetail (transport failure, a non-raftmq peer, a handler
# outside `rpc_errors`): the closest typed error.
_BY_BARE_STATUS: dict[grpc.StatusCode, type[RaftMQError]] = {
    _SC.INVALID_ARGUMENT: InvalidArgumentError,
    _SC.FAILED_PRECONDITION: InvalidArgumentError,
    _SC.NOT_FOUND: NoRouteError,
    _SC.ALREADY_EXISTS: TopicAlreadyExistsError,
    _SC.PERMISSION_DENIED: PermissionDeniedError,
    _SC.UNAUTHENTICATED: UnauthenticatedError,
    _SC.OUT_OF_RANGE: OffsetOutOfRangeError,
    _SC.UNIMPLEMENTED: UnsupportedError,
    _SC.UNAVAILABLE: BrokerUnavailableError,
    _SC.DEADLINE_EXCEEDED: RequestTimeoutError,
    _SC.RESOURCE_EXHAUSTED: ThrottledError,
    _SC.CANCELLED: OutcomeUnknownError,
    _SC.ABORTED: OutcomeUnknownError,
    _SC.UNKNOWN: OutcomeUnknownError,
    _SC.DATA_LOSS: InternalError,
    _SC.INTERNAL: InternalError,
}


def _check_table() -> None:
    """The table is the single source: one row per class, codes equal to the proto enum names."""
    if len(_BY_CLASS) != len(ERROR_TABLE) or len(_BY_CODE) != len(ERROR_TABLE):
        raise AssertionError("duplicate class or code in ERROR_TABLE")
    proto_codes = set(common_pb2.ErrorCode.keys()) - {"ERROR_CODE_UNSPECIFIED"}
    if proto_codes != set(_BY_CODE):
        raise AssertionError(
            f"ERROR_TABLE codes differ from common.proto ErrorCode: {proto_codes ^ set(_BY_CODE)}"
        )


_check_table()


def row_for(exc_type: type[RaftMQError]) -> ErrorRow:
    """The row of an error class, or of its nearest tabled base class."""
    for klass in exc_type.__mro__:
        row = _BY_CLASS.get(klass)
        if row is not None:
            return row
    return _BY_CLASS[InternalError]  # RaftMQError itself, or an untabled direct subclass


def _int_detail(details: Mapping[str, str], key: str) -> int | None:
    value = details.get(key)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _clip(text: str) -> str:
    return text if len(text) <= MAX_MESSAGE_CHARS else text[: MAX_MESSAGE_CHARS - 3] + "..."


# ---- server side --------------------------------------------------------------------------------


def to_detail(exc: RaftMQError) -> common_pb2.ErrorDetail:
    row = row_for(type(exc))
    return common_pb2.ErrorDetail(
        code=row.code,
        message=_clip(exc.message),
        leader_hint=exc.leader_hint,
        details=exc.details,
    )


def abort_with(context: grpc.ServicerContext, exc: RaftMQError) -> NoReturn:
    """End the current RPC with `exc`'s status, its message and an ErrorDetail trailer."""
    row = row_for(type(exc))
    context.set_trailing_metadata(((ERROR_DETAIL_KEY, to_detail(exc).SerializeToString()),))
    context.abort(row.status, _clip(exc.message))


def _already_aborted(context: grpc.ServicerContext) -> bool:
    # grpc's abort() raises a bare Exception after recording the status; do not re-wrap it.
    code_of = getattr(context, "code", None)
    code = code_of() if callable(code_of) else None
    return isinstance(code, grpc.StatusCode) and code is not grpc.StatusCode.OK


def internal_error(method: str, exc: BaseException) -> InternalError:
    """Log `exc` with its traceback under a fresh error id; the peer gets only the id."""
    error_id = uuid.uuid4().hex[:12]
    _log.error(
        "rpc.internal_error method=%s error_id=%s type=%s",
        method,
        error_id,
        type(exc).__name__,
        exc_info=exc,
    )
    return InternalError(
        f"internal error in {method} ({type(exc).__name__}); the server logged it with "
        f"error_id={error_id}; please report it",
        details={"error_id": error_id},
    )


_Self = TypeVar("_Self")
_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp")
Handler = Callable[[_Self, _Req, grpc.ServicerContext], _Resp]


def rpc_errors(handler: Handler[_Self, _Req, _Resp]) -> Handler[_Self, _Req, _Resp]:
    """Decorate a unary servicer method: RaftMQError -> its status; anything else -> INTERNAL."""
    method = handler.__qualname__

    @functools.wraps(handler)
    def wrapper(self: _Self, request: _Req, context: grpc.ServicerContext) -> _Resp:
        try:
            return handler(self, request, context)
        except RaftMQError as exc:
            abort_with(context, exc)
        except Exception as exc:
            if _already_aborted(context):
                raise
            abort_with(context, internal_error(method, exc))

    return wrapper


# ---- client side --------------------------------------------------------------------------------


_CODE_VALUES = frozenset(common_pb2.ErrorCode.values())
_BARE_HINTS: dict[type[RaftMQError], str] = {
    BrokerUnavailableError: " (the server is unreachable or shutting down; retry or use another "
    "node)",
    RequestTimeoutError: " (no answer within the deadline; raise the timeout or retry)",
    OutcomeUnknownError: " (the call ended without a clear outcome; retry idempotently)",
}


def _detail_from(err: grpc.RpcError) -> common_pb2.ErrorDetail | None:
    try:
        trailers = err.trailing_metadata() or ()
    except Exception:  # a synthetic RpcError without call state
        return None
    for item in trailers:
        key, value = item.key, item.value  # grpc's _Metadatum namedtuple
        if key == ERROR_DETAIL_KEY and isinstance(value, bytes):
            try:
                return common_pb2.ErrorDetail.FromString(value)
            except Exception:  # a garbled trailer falls back to the bare status
                return None
    return None


# What gRPC reports when the two ends disagree about TLS: a plaintext client to a TLS port (the
# server closes the socket), a TLS client to a plaintext port, or a refused/missing certificate.
_TLS_SIGNS = re.compile(r"Socket closed|handshake|SSL|certificate|tls", re.IGNORECASE)
TLS_HINT = (
    " (if the cluster uses TLS, the client needs its CA, and with mutual TLS a client "
    "certificate: tls_ca/tls_cert/tls_key arguments, RAFTMQ_TLS_CA/_CERT/_KEY or "
    "--tls-ca/--tls-cert/--tls-key; otherwise the server is unreachable or shutting down)"
)


def from_rpc_error(err: grpc.RpcError) -> RaftMQError:
    """The typed error for a failed call; never raises."""
    try:
        status = err.code()
        text = err.details() or ""
    except Exception:
        status, text = grpc.StatusCode.UNKNOWN, str(err)
    detail = _detail_from(err)
    if detail is not None:
        code = common_pb2.ErrorCode.Name(detail.code) if detail.code in _CODE_VALUES else ""
        row = _BY_CODE.get(code)
        if row is not None:
            return row.exc(
                detail.message or text,
                leader_hint=detail.leader_hint,
                details=dict(detail.details),
            )
    exc_type = _BY_BARE_STATUS.get(status, InternalError)
    name = status.name if isinstance(status, grpc.StatusCode) else str(status)
    hint = _BARE_HINTS.get(exc_type, "")
    if status == grpc.StatusCode.UNAVAILABLE and _TLS_SIGNS.search(text):
        hint = TLS_HINT  # a TLS server closes a plaintext (or certificate-less) client at once
    return exc_type(
        f"{name}: {text or 'no details'}" + hint,
        details={"grpc_status": name},
    )
