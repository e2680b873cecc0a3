"""The users and policies as part of the controller's replicated state (issue 19): ACL commands
in, a versioned `Acl` snapshot out. Pure and deterministic like controller/state.py: every
controller applies the same committed commands in the same order and holds the same ACL.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from raftmq.common.acl import (
    MAX_POLICY_ENTRIES,
    MAX_USERS,
    Acl,
    PolicyEntry,
    User,
    check_name,
)
from raftmq.common.errors import InvalidArgumentError

KINDS = ("put_user", "delete_user", "set_policy", "delete_policy")
PUT_MODES = ("upsert", "create", "update")


@dataclass(frozen=True, slots=True)
class AclCommand:
    kind: str  # one of KINDS
    name: str  # the user (put/delete user) or the policy's subject
    user: User | None = None  # put_user
    mode: str = "upsert"  # put_user: one of PUT_MODES
    entries: tuple[PolicyEntry, ...] = ()  # set_policy

    def encode(self) -> bytes:
        raw: dict[str, Any] = {"op": "acl", "kind": self.kind, "name": self.name}
        if self.user is not None:
            raw["user"] = self.user.to_dict()
            raw["mode"] = self.mode
        if self.kind == "set_policy":
            raw["entries"] = [e.to_dict() for e in self.entries]
        return json.dumps(raw, separators=(",", ":")).encode()

    @classmethod
    def from_raw(cls, raw: dict[str, Any]) -> AclCommand:
        """A decoded `{"op": "acl", ...}`; InvalidArgumentError (a CommandError to the caller)
        when it breaks a rule of its shape."""
        kind = str(raw["kind"])
        if kind not in KINDS:
            raise InvalidArgumentError(f"unknown ACL command {kind!r}")
        name = check_name(str(raw["name"]))
        user = User.from_dict(raw["user"]) if kind == "put_user" else None
        if user is not None and user.name != name:
            raise InvalidArgumentError("put_user: the command's name is not the user's")
        mode = str(raw.get("mode", "upsert"))
        if mode not in PUT_MODES:
            raise InvalidArgumentError(f"put_user mode {mode!r}: one of {PUT_MODES}")
        entries = (
            tuple(PolicyEntry.from_dict(e) for e in raw["entries"]) if kind == "set_policy" else ()
        )
        if len(entries) > MAX_POLICY_ENTRIES:
            raise InvalidArgumentError(f"at most {MAX_POLICY_ENTRIES} entries in a policy")
        return cls(kind, name, user, mode, entries)


class AclState:
    """Users, policies and the count of accepted changes (the snapshot's version)."""

    def __init__(self) -> None:
        self.users: dict[str, User] = {}
        self.policies: dict[str, tuple[PolicyEntry, ...]] = {}
        self.version = 0
        self._snapshot: Acl | None = None

    def apply(self, c: AclCommand) -> tuple[bool, str]:
        """(accepted, reason); a refused command changes nothing and not the version."""
        if c.kind == "put_user":
            assert c.user is not None
            exists = c.name in self.users
            if c.mode == "create" and exists:
                return False, f"user {c.name!r} exists; use `raftmq acl user update`"
            if c.mode == "update" and not exists:
                return False, f"user {c.name!r} does not exist; create it first"
            if not exists and len(self.users) >= MAX_USERS:
                return False, f"at most {MAX_USERS} users"
            self.users[c.name] = c.user
        elif c.kind == "delete_user":
            if self.users.pop(c.name, None) is None:
                return False, f"user {c.name!r} does not exist"
            self.policies.pop(c.name, None)  # a user's policy goes with the user
        elif c.kind == "set_policy":
            if c.name not in self.users:
                return False, f"user {c.name!r} does not exist; create it first"
            self.policies[c.name] = c.entries
        elif self.policies.pop(c.name, None) is None:  # delete_policy
            return False, f"user {c.name!r} has no policy"
        self.version += 1
        self._snapshot = None
        return True, f"acl {c.kind} {c.name}"

    def snapshot(self) -> Acl:
        """The current ACL as an immutable value (built once per version)."""
        if self._snapshot is None:
            self._snapshot = Acl(self.version, dict(self.users), dict(self.policies))
        return self._snapshot
