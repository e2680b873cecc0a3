"""The check every node runs on every request when auth is on (issue 19): authenticate the
signature, then authorize what the RPC table (common/rpc_acl.py) says the request needs, against
the node's current ACL snapshot. Decisions come from the pure `common.acl.authorize`; this module
adds bounded caches (per subject and resource, dropped when the ACL version changes) and the
gRPC interceptor. It never logs a secret and never lets an unchecked request through: a method
without a rule is refused.
"""

from __future__ import annotations

import contextvars
import logging
import shlex
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf.message import DecodeError, Message
from google.protobuf.message_factory import GetMessageClass

from raftmq.common.acl import (
    Acl,
    Action,
    Decision,
    Refusal,
    Resource,
    User,
    UserType,
    authorize,
    topic,
    why_denied,
)
from raftmq.common.auth import (
    AUTHORIZATION_KEY,
    DATE_TIME_KEY,
    DEFAULT_WINDOW_MS,
    SignedRequest,
    parse_authorization,
    parse_hello_auth,
    signed_at_ms,
    verify,
)
from raftmq.common.errors import AccessDeniedError, RaftMQError, UnauthenticatedError, abort_with
from raftmq.common.quota import ANONYMOUS
from raftmq.common.rpc_acl import FRAME_RULES, MAX_NEEDS, RULES, SUPER, Need

_log = logging.getLogger("auth")

# The authenticated subject of the gRPC call being served (anonymous with auth off), whose byte
# quotas apply (issue 27): set around the handler by AuthInterceptor (a threaded server) or the
# proxy's handlers (a grpc.aio task each), read by the service.
CALLER: contextvars.ContextVar[str] = contextvars.ContextVar("rpc_caller", default=ANONYMOUS)

MAX_CACHED_DECISIONS = 65_536
_Decisions = dict[tuple[str, "Action | frozenset[Action]", Resource], Decision]
_Signatures = dict[tuple[str, ...], tuple[str, int]]  # signed form -> (subject, signed at ms)
MAX_CACHED_SIGNATURES = 4_096


@dataclass(frozen=True, slots=True)
class AuthConfig:
    """What a node needs to check requests: on or off, the admin (a super user from the cluster
    description, not replicated) and the replay window."""

    enabled: bool = False
    admin: User | None = None
    window_ms: int = DEFAULT_WINDOW_MS

    @classmethod
    def of(cls, enabled: bool, access_key: str, secret_key: str, window_ms: int) -> AuthConfig:
        """From a role's settings (auth_enabled, auth_admin_access_key, ...)."""
        if not enabled:
            return cls()
        if not access_key or not secret_key:
            raise ValueError(
                "auth_enabled needs auth_admin_access_key and auth_admin_secret_key (or "
                "RAFTMQ_ADMIN_ACCESS_KEY / RAFTMQ_ADMIN_SECRET_KEY)"
            )
        return cls(True, User(access_key, secret_key, UserType.SUPER), window_ms)


class Guard:
    """Thread-safe; one per node. `acl` returns the node's current snapshot (cheap)."""

    def __init__(
        self,
        config: AuthConfig,
        acl: Callable[[], Acl],
        clock_ms: Callable[[], int] | None = None,
    ) -> None:
        assert config.enabled and config.admin is not None
        self.config = config
        self._acl = acl
        self._clock_ms = clock_ms or (lambda: time.time_ns() // 1_000_000)
        self._lock = threading.Lock()
        # (version, decisions, signatures): the caches of one ACL version, swapped whole, so an
        # entry computed from one version can never be read under another
        self._caches: tuple[int, _Decisions, _Signatures] = (-1, {}, {})
        self.denied = 0
        self.refused = 0

    # -- authentication

    def authenticate(self, req: SignedRequest) -> str:
        return self._authenticate((req.access_key, req.when, req.signature), lambda: req)

    def _authenticate(self, key: tuple[str, ...], parse: Callable[[], SignedRequest]) -> str:
        """`key` names the signed form as it arrived (so a repeat skips parsing and HMAC);
        `parse` gives the request when it must be verified."""
        acl, _, signatures = self._fresh()
        hit = signatures.get(key)
        now_ms = self._clock_ms()
        try:
            # a signature that matched this version's secret; the window still counts
            if hit is not None and abs(now_ms - hit[1]) <= self.config.window_ms:
                return hit[0]
            req = parse()
            subject = verify(req, acl, self.config.admin, now_ms, self.config.window_ms)
        except UnauthenticatedError:
            self.refused += 1
            raise
        with self._lock:
            if len(signatures) >= MAX_CACHED_SIGNATURES:
                signatures.clear()
            signatures[key] = (subject, signed_at_ms(req.when))
        return subject

    def authenticate_metadata(self, metadata: Iterable[tuple[str, str | bytes]] | None) -> str:
        header = when = ""
        for key, value in metadata or ():
            if key == AUTHORIZATION_KEY and isinstance(value, str):
                header = value
            elif key == DATE_TIME_KEY and isinstance(value, str):
                when = value
        if not header:
            self.refused += 1
            raise UnauthenticatedError(
                "this cluster requires signed requests: give an access key and secret key "
                "(--access-key/--secret-key, RAFTMQ_ACCESS_KEY/RAFTMQ_SECRET_KEY or a "
                "credentials file)"
            )
        return self._authenticate((header, when), lambda: parse_authorization(header, when))

    def authenticate_hello(self, auth_method: int, auth: bytes) -> str:
        return self._authenticate(
            (str(auth_method), auth.decode("latin-1")),
            lambda: parse_hello_auth(auth_method, auth),
        )

    # -- authorization

    def check(self, subject: str, needs: Iterable[Need]) -> None:
        """Raise AccessDeniedError naming the first need the ACL refuses."""
        acl, decisions, _ = self._fresh()
        for count, need in enumerate(needs, 1):
            if count > MAX_NEEDS:
                raise AccessDeniedError(
                    f"the request touches more than {MAX_NEEDS} resources; split it",
                    details={"subject": subject},
                )
            if self._decide(acl, decisions, subject, need) is Decision.DENY:
                self.denied += 1
                action, resource = need
                if need == SUPER[0]:
                    raise AccessDeniedError(
                        f"user {subject!r} may not call this: it is for super users only (the "
                        "cluster's nodes and operators)",
                        details={"subject": subject, "action": "Super", "resource": "Cluster"},
                    )
                actions = (
                    sorted(action, key=_grant_order) if isinstance(action, frozenset) else [action]
                )
                refusal = why_denied(acl, subject, actions, resource, self.config.admin)
                raise denial(subject, actions, str(resource), refusal)

    def check_path(self, subject: str, path: str, request: Any) -> None:
        rule = RULES.get(path)
        if rule is None:
            self.denied += 1
            raise AccessDeniedError(
                f"method {path} has no access rule; refused",
                details={"subject": subject, "method": path},
            )
        self.check(subject, rule(request))

    def check_topic(self, subject: str, action: Action, name: str) -> None:
        """One topic of a request that carries many (SEND_BATCHES: each batch on its own)."""
        self.check(subject, ((action, topic(name)),))

    def check_frame(self, subject: str, method: int, request: Any) -> None:
        rule = FRAME_RULES.get(method)
        if rule is None:
            self.denied += 1
            raise AccessDeniedError(
                f"framed method {method} has no access rule; refused",
                details={"subject": subject, "method": str(method)},
            )
        self.check(subject, rule(request))

    def _decide(self, acl: Acl, decisions: _Decisions, subject: str, need: Need) -> Decision:
        key = (subject, need[0], need[1])
        hit = decisions.get(key)
        if hit is not None:
            return hit
        if need == SUPER[0]:
            user = acl.user(subject, self.config.admin)
            decision = (
                Decision.ALLOW
                if user is not None and user.type is UserType.SUPER
                else Decision.DENY
            )
        elif isinstance(need[0], frozenset):  # any one of the actions
            allowed = any(
                authorize(acl, subject, a, need[1], self.config.admin) is Decision.ALLOW
                for a in need[0]
            )
            decision = Decision.ALLOW if allowed else Decision.DENY
        else:
            decision = authorize(acl, subject, need[0], need[1], self.config.admin)
        with self._lock:
            if len(decisions) >= MAX_CACHED_DECISIONS:
                decisions.clear()
            decisions[key] = decision
        return decision

    def _fresh(self) -> tuple[Acl, _Decisions, _Signatures]:
        """The current snapshot and its version's caches; a new version starts empty caches (a
        deleted user or a changed secret or policy takes effect at once on this node)."""
        acl = self._acl()
        caches = self._caches
        if caches[0] != acl.version:
            with self._lock:
                caches = self._caches
                if caches[0] != acl.version:
                    caches = self._caches = (acl.version, {}, {})
        return acl, caches[1], caches[2]


# ---- gRPC ---------------------------------------------------------------------------------------


def request_types(services: Sequence[Any]) -> dict[str, type[Message]]:
    """Method path -> request class, for the services (ServiceDescriptors) a server serves."""
    return {
        f"/{s.full_name}/{m.name}": GetMessageClass(m.input_type)
        for s in services
        for m in s.methods
    }


if TYPE_CHECKING:
    _ServerInterceptor = grpc.ServerInterceptor[Any, Any]
else:  # grpc's classes are generic in its stubs only
    _ServerInterceptor = grpc.ServerInterceptor


class AuthInterceptor(_ServerInterceptor):
    """Authenticates and authorizes every unary call of a (threaded) grpc.Server before its
    handler runs: a failure ends the call with UNAUTHENTICATED or PERMISSION_DENIED and our
    ErrorDetail, like any raftmq error."""

    def __init__(self, guard: Guard, services: Sequence[Any]) -> None:
        self.guard = guard
        self._types = request_types(services)

    def intercept_service(self, continuation: Any, details: Any) -> Any:
        handler = continuation(details)
        if handler is None:
            return None
        path: str = details.method
        metadata = details.invocation_metadata
        guard, req_type = self.guard, self._types.get(path)
        if handler.unary_unary is None:
            return _refuse_streaming(path)
        inner = handler.unary_unary

        def behavior(request: Any, context: grpc.ServicerContext) -> Any:
            try:
                subject = guard.authenticate_metadata(metadata)
                parsed = request
                if isinstance(request, bytes) and req_type is not None:
                    try:
                        parsed = req_type.FromString(request)
                    except (DecodeError, ValueError):
                        parsed = None  # the handler refuses it with INVALID_ARGUMENT
                if parsed is not None:
                    guard.check_path(subject, path, parsed)
            except RaftMQError as exc:
                abort_with(context, exc)
            # A pool thread serves call after call: the subject is this call's only.
            token = CALLER.set(subject)
            try:
                return inner(request, context)
            finally:
                CALLER.reset(token)

        return grpc.unary_unary_rpc_method_handler(
            behavior,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


def _refuse_streaming(path: str) -> Any:
    def behavior(request: Any, context: grpc.ServicerContext) -> Any:
        abort_with(context, AccessDeniedError(f"streaming method {path} is not checked; refused"))

    return grpc.unary_unary_rpc_method_handler(behavior)


# When any one of several actions would do (a route lookup: Get, Pub or Sub), the grant offered
# is the least: reading before writing.
_GRANT_ORDER = (Action.GET, Action.LIST, Action.SUB, Action.PUB)


def _grant_order(action: Action) -> int:
    return _GRANT_ORDER.index(action) if action in _GRANT_ORDER else len(_GRANT_ORDER)


def denial(
    subject: str, actions: Sequence[Action], resource: str, refusal: Refusal
) -> AccessDeniedError:
    """The AccessDeniedError of a refused request: whether the user is unknown, a Deny entry
    matched or no Allow entry did, and the one command that grants it without touching the rest
    of the user's policy (`raftmq acl policy add`, or `remove` of the matching Deny)."""
    if len(actions) == 1:
        refused = f"may not {actions[0].value} on {resource}"
    else:  # a route lookup: any one of them would do
        refused = f"may do none of {', '.join(a.value for a in actions)} on {resource}"
    user = shlex.quote(subject)
    entry = shlex.quote(f"{resource}={actions[0].value}")
    grant = f"raftmq acl policy add {user} {entry}"
    if refusal.deny is not None:
        why = f"its policy's Deny entry {refusal.deny.spec} matches (a Deny wins over any Allow)"
        lift = f"raftmq acl policy remove {user} --deny {shlex.quote(refusal.deny.spec)}"
        grant = lift if refusal.allowed_otherwise else f"{lift} && {grant}"
        reason = "deny"
    elif refusal.user_known:
        why = "no Allow entry of its policy covers it"
        reason = "no_allow"
    else:
        why = "no such user is known to the ACL"
        grant = f"raftmq acl user create {user} --user-secret <SECRET> && {grant}"
        reason = "unknown_user"
    return AccessDeniedError(
        f"user {subject!r} {refused}: {why}; an administrator grants it with `{grant}`",
        details={
            "subject": subject,
            "action": "|".join(a.value for a in actions),
            "resource": resource,
            "reason": reason,
            "grant": grant,
        },
    )
