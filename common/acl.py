"""Users, policies and the access decision in RocketMQ ACL 2.0's shape, as plain values.

`authorize(acl, subject, action, resource)` is a pure function: no clock, no I/O, no cache.
The replicated copy lives in the controller (controller/acl_state.py); every node checks
requests against a snapshot of it (common/auth_guard.py). Nothing here logs or raises on a
denial: callers turn a DENY into `AccessDeniedError`.
"""

from __future__ import annotations

import enum
import functools
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from raftmq.common.errors import InvalidArgumentError

MAX_USERS = 10_000
MAX_POLICY_ENTRIES = 1_000  # per user
MAX_NAME_CHARS = 128
MIN_SECRET_CHARS = 6


class Action(enum.Enum):
    """RocketMQ ACL 2.0's actions. ALL in a policy entry grants or denies every action."""

    PUB = "Pub"
    SUB = "Sub"
    CREATE = "Create"
    UPDATE = "Update"
    DELETE = "Delete"
    GET = "Get"
    LIST = "List"
    ALL = "All"

    __hash__ = object.__hash__  # members are singletons; Enum's own hash is a Python call

    @classmethod
    def parse(cls, text: str) -> Action:
        for a in cls:
            if a.value.lower() == text.strip().lower():
                return a
        raise InvalidArgumentError(
            f"unknown action {text!r}; one of {', '.join(a.value for a in cls)}"
        )


class ResourceType(enum.Enum):
    CLUSTER = "Cluster"  # the cluster itself: brokers, routes, leadership, status
    TOPIC = "Topic"
    GROUP = "Group"  # a consumer group

    __hash__ = object.__hash__  # as Action's: decisions are cached by (subject, action, resource)

    @classmethod
    def parse(cls, text: str) -> ResourceType:
        for t in cls:
            if t.value.lower() == text.strip().lower():
                return t
        raise InvalidArgumentError(
            f"unknown resource type {text!r}; one of {', '.join(t.value for t in cls)}"
        )


class Decision(enum.Enum):
    ALLOW = "Allow"
    DENY = "Deny"

    @classmethod
    def parse(cls, text: str) -> Decision:
        for d in cls:
            if d.value.lower() == text.strip().lower():
                return d
        raise InvalidArgumentError(f"unknown decision {text!r}; Allow or Deny")


class UserType(enum.Enum):
    SUPER = "Super"  # every action on every resource, and the ACL itself
    NORMAL = "Normal"

    @classmethod
    def parse(cls, text: str) -> UserType:
        for t in cls:
            if t.value.lower() == text.strip().lower():
                return t
        raise InvalidArgumentError(f"unknown user type {text!r}; Super or Normal")


@dataclass(frozen=True, slots=True)
class Resource:
    """One thing a request touches: `Topic:orders-eu`, `Group:billing`, `Cluster:*`."""

    type: ResourceType
    name: str
    _hash: int = field(init=False, repr=False, compare=False, default=0)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.type, self.name)))

    def __hash__(self) -> int:  # computed once: resources are cache keys on every request
        return self._hash

    def __str__(self) -> str:
        return f"{self.type.value}:{self.name}"


CLUSTER = Resource(ResourceType.CLUSTER, "*")


@functools.lru_cache(maxsize=4096)
def topic(name: str) -> Resource:
    """The resource of a topic; a group's retry and dead-letter topics are the group's own
    (RocketMQ: `%RETRY%billing` is checked as `Group:billing`)."""
    for prefix in ("%RETRY%", "%DLQ%"):
        if name.startswith(prefix):
            return Resource(ResourceType.GROUP, name[len(prefix) :])
    return Resource(ResourceType.TOPIC, name)


@functools.lru_cache(maxsize=4096)
def group(name: str) -> Resource:
    return Resource(ResourceType.GROUP, name)


@dataclass(frozen=True, slots=True)
class ResourcePattern:
    """`Topic:orders*` (prefix), `Group:billing` (literal), `Topic:*` or `*` (any of a type /
    anything). Only a trailing `*` is a wildcard, as in RocketMQ's PREFIXED pattern."""

    type: ResourceType | None  # None: every type (`*`)
    name: str  # without the trailing `*` when prefix
    prefix: bool

    @classmethod
    def parse(cls, text: str) -> ResourcePattern:
        text = text.strip()
        if text == "*":
            return cls(None, "", True)
        kind, sep, name = text.partition(":")
        if not sep or not name:
            raise InvalidArgumentError(
                f"resource {text!r} is not TYPE:NAME; e.g. Topic:orders*, Group:billing, "
                "Topic:*, Cluster:* or * for everything"
            )
        prefix = name.endswith("*")
        core = name[:-1] if prefix else name
        if "*" in core:
            raise InvalidArgumentError(
                f"resource {text!r}: only a trailing * is a wildcard (Topic:orders*)"
            )
        if len(core) > MAX_NAME_CHARS:
            raise InvalidArgumentError(f"resource {text!r} is longer than {MAX_NAME_CHARS} chars")
        return cls(ResourceType.parse(kind), core, prefix)

    def matches(self, r: Resource) -> bool:
        if self.type is not None and self.type is not r.type:
            return False
        return r.name.startswith(self.name) if self.prefix else r.name == self.name

    def __str__(self) -> str:
        if self.type is None:
            return "*"
        return f"{self.type.value}:{self.name}{'*' if self.prefix else ''}"


@dataclass(frozen=True, slots=True)
class PolicyEntry:
    resource: ResourcePattern
    actions: frozenset[Action]
    decision: Decision

    def covers(self, action: Action, r: Resource) -> bool:
        return (Action.ALL in self.actions or action in self.actions) and self.resource.matches(r)

    @property
    def spec(self) -> str:
        """The entry as `raftmq acl policy` takes it: `RESOURCE=ACTION[,ACTION...]`."""
        return f"{self.resource}={','.join(sorted(a.value for a in self.actions))}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "resource": str(self.resource),
            "actions": sorted(a.value for a in self.actions),
            "decision": self.decision.value,
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> PolicyEntry:
        try:
            actions = raw["actions"]
            if isinstance(actions, str):
                actions = [a for a in actions.split(",") if a.strip()]
            if not actions:
                raise InvalidArgumentError("a policy entry needs at least one action")
            return cls(
                ResourcePattern.parse(str(raw["resource"])),
                frozenset(Action.parse(str(a)) for a in actions),
                Decision.parse(str(raw.get("decision", "Allow"))),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise InvalidArgumentError(
                f"a policy entry needs resource, actions and decision: {exc}"
            ) from None


@dataclass(frozen=True, slots=True)
class User:
    name: str
    secret: str
    type: UserType = UserType.NORMAL

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "secret": self.secret, "type": self.type.value}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> User:
        try:
            return make_user(str(raw["name"]), str(raw["secret"]), str(raw.get("type", "Normal")))
        except (KeyError, TypeError) as exc:
            raise InvalidArgumentError(f"a user needs name and secret: {exc}") from None


def check_name(name: str) -> str:
    if not name or len(name) > MAX_NAME_CHARS or not all(c.isalnum() or c in "-_." for c in name):
        raise InvalidArgumentError(
            f"user name {name!r} is invalid: 1..{MAX_NAME_CHARS} letters, digits, '-', '_', '.'"
        )
    return name


def make_user(name: str, secret: str, type_: str = "Normal") -> User:
    check_name(name)
    if len(secret) < MIN_SECRET_CHARS or len(secret) > 256 or not secret.isprintable():
        raise InvalidArgumentError(
            f"the secret key of {name!r} must be {MIN_SECRET_CHARS}..256 printable characters"
        )
    return User(name, secret, UserType.parse(type_))


@dataclass(frozen=True, slots=True)
class Acl:
    """One version of the users and policies (what every node checks against).

    `version` counts applied ACL changes on the controller; a node that holds a higher version
    knows more. `admin` is the cluster description's admin user: a super user that is not in
    the replicated state (so a cluster can be bootstrapped and never locks its operator out).
    """

    version: int = 0
    users: Mapping[str, User] = field(default_factory=dict)
    policies: Mapping[str, tuple[PolicyEntry, ...]] = field(default_factory=dict)

    def user(self, name: str, admin: User | None = None) -> User | None:
        if admin is not None and name == admin.name:
            return admin
        return self.users.get(name)

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "version": self.version,
                "users": [u.to_dict() for u in sorted(self.users.values(), key=lambda u: u.name)],
                "policies": {
                    s: [e.to_dict() for e in es] for s, es in sorted(self.policies.items())
                },
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Acl:
        try:
            raw = json.loads(data)
            users = {u.name: u for u in (User.from_dict(x) for x in raw["users"])}
            policies = {
                str(s): tuple(PolicyEntry.from_dict(e) for e in es)
                for s, es in raw["policies"].items()
            }
            return cls(int(raw["version"]), users, policies)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise InvalidArgumentError(f"an ACL snapshot that does not decode: {exc}") from None


def authorize(
    acl: Acl,
    subject: str,
    action: Action,
    resource: Resource,
    admin: User | None = None,
) -> Decision:
    """The decision for `subject` doing `action` on `resource`: a super user may do anything;
    otherwise a matching Deny entry wins over any Allow, and no matching entry is a Deny."""
    user = acl.user(subject, admin)
    if user is None:
        return Decision.DENY
    if user.type is UserType.SUPER:
        return Decision.ALLOW
    allowed = False
    for entry in acl.policies.get(subject, ()):
        if entry.covers(action, resource):
            if entry.decision is Decision.DENY:
                return Decision.DENY
            allowed = True
    return Decision.ALLOW if allowed else Decision.DENY


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why `authorize` said Deny for a user that is not super: the user is unknown, or a Deny
    entry matched (`deny`), or no Allow entry covered the request (`deny` is None)."""

    user_known: bool
    deny: PolicyEntry | None = None
    allowed_otherwise: bool = False  # an Allow entry covers it too (only the Deny stands between)


def why_denied(
    acl: Acl,
    subject: str,
    actions: Iterable[Action],
    resource: Resource,
    admin: User | None = None,
) -> Refusal:
    """The reason behind a Deny of `subject` doing any of `actions` on `resource`."""
    if acl.user(subject, admin) is None:
        return Refusal(user_known=False)
    wanted = tuple(actions)
    entries = acl.policies.get(subject, ())
    allowed = any(
        e.decision is Decision.ALLOW and any(e.covers(a, resource) for a in wanted) for e in entries
    )
    for entry in entries:
        if entry.decision is Decision.DENY and any(entry.covers(a, resource) for a in wanted):
            return Refusal(user_known=True, deny=entry, allowed_otherwise=allowed)
    return Refusal(user_known=True)


def with_entries(
    current: Iterable[PolicyEntry],
    add: Iterable[PolicyEntry] = (),
    remove: Iterable[PolicyEntry] = (),
) -> tuple[PolicyEntry, ...]:
    """A policy with entries added (once each, in order, after the kept ones) and others
    removed (by equality); what `raftmq acl policy add|remove` write."""
    gone = set(remove)
    out = [e for e in current if e not in gone]
    for e in add:
        if e not in out:
            out.append(e)
    if len(out) > MAX_POLICY_ENTRIES:
        raise InvalidArgumentError(f"{len(out)} entries; at most {MAX_POLICY_ENTRIES} per user")
    return tuple(out)


def parse_entries(specs: Iterable[str], decision: str = "Allow") -> tuple[PolicyEntry, ...]:
    """`raftmq acl policy set`'s entries: each `RESOURCE=ACTION[,ACTION...]`, e.g.
    `Topic:orders*=Pub,Sub`."""
    out = []
    for spec in specs:
        resource, sep, actions = spec.partition("=")
        if not sep:
            raise InvalidArgumentError(
                f"policy entry {spec!r} is not RESOURCE=ACTIONS (e.g. Topic:orders*=Pub,Sub)"
            )
        out.append(
            PolicyEntry.from_dict({"resource": resource, "actions": actions, "decision": decision})
        )
    if len(out) > MAX_POLICY_ENTRIES:
        raise InvalidArgumentError(f"{len(out)} entries; at most {MAX_POLICY_ENTRIES} per user")
    return tuple(out)
