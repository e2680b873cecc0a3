"""`Admin.acl`: users and policies (issue 19), kept by the controllers. Writes go to the
controller leader (a NOT_LEADER answer's hint is followed); reads ask any controller.
Secrets are sent only to the controllers, and `users()` never returns them."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import grpc

from raftmq.client.routes import ChannelPool
from raftmq.common.acl import Acl, PolicyEntry, make_user, with_entries
from raftmq.common.errors import (
    BrokerUnavailableError,
    InvalidArgumentError,
    NotLeaderError,
    RaftMQError,
    from_rpc_error,
)
from raftmq.common.pb import controller_pb2, controller_pb2_grpc

_T = TypeVar("_T")
CALL_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class UserInfo:
    name: str
    type: str  # "Super" or "Normal"


class AclAdmin:
    def __init__(self, pool: ChannelPool, controllers: Sequence[str]) -> None:
        self._pool = pool
        self._controllers = tuple(controllers)

    # ---- users

    def create_user(self, name: str, secret: str, user_type: str = "Normal") -> int:
        """Add a user (its name is the access key); the new ACL version."""
        return self._put(name, secret, user_type, controller_pb2.PUT_CREATE)

    def update_user(self, name: str, secret: str, user_type: str = "Normal") -> int:
        return self._put(name, secret, user_type, controller_pb2.PUT_UPDATE)

    def delete_user(self, name: str) -> int:
        """Remove a user and its policy."""
        return self._write(
            lambda s: s.DeleteUser(
                controller_pb2.DeleteUserRequest(name=name), timeout=CALL_TIMEOUT_S
            )
        ).version

    def users(self) -> list[UserInfo]:
        acl = self.snapshot()
        return [UserInfo(u.name, u.type.value) for u in sorted(acl.users.values(), key=_name)]

    # ---- policies

    def set_policy(self, subject: str, entries: Iterable[PolicyEntry]) -> int:
        """Replace `subject`'s policy with `entries`."""
        req = controller_pb2.SetPolicyRequest(
            subject=subject,
            entries=[
                controller_pb2.AclPolicyEntry(
                    resource=str(e.resource),
                    actions=sorted(a.value for a in e.actions),
                    decision=e.decision.value,
                )
                for e in entries
            ],
        )
        return self._write(lambda s: s.SetPolicy(req, timeout=CALL_TIMEOUT_S)).version

    def add_to_policy(
        self,
        subject: str,
        add: Iterable[PolicyEntry] = (),
        remove: Iterable[PolicyEntry] = (),
    ) -> tuple[int, tuple[PolicyEntry, ...]]:
        """Add entries to `subject`'s policy and remove others, keeping the rest: (the ACL
        version, the policy written). A read then a write: two administrators editing one
        user's policy at the same moment, the last write wins."""
        current = self.snapshot().policies.get(subject, ())
        entries = with_entries(current, add, remove)
        return self.set_policy(subject, entries), entries

    def delete_policy(self, subject: str) -> int:
        return self._write(
            lambda s: s.DeletePolicy(
                controller_pb2.DeletePolicyRequest(subject=subject), timeout=CALL_TIMEOUT_S
            )
        ).version

    def policies(self) -> dict[str, tuple[PolicyEntry, ...]]:
        return dict(sorted(self.snapshot().policies.items()))

    def snapshot(self) -> Acl:
        """The ACL as the first controller that answers holds it (with the secrets: the call
        is for super users only)."""
        out = self._call(
            lambda s: s.GetAcl(
                controller_pb2.GetAclRequest(known_version=-1), timeout=CALL_TIMEOUT_S
            ),
            follow_leader=False,
        )
        return Acl.from_json(out.snapshot)

    # ---- plumbing

    def _put(self, name: str, secret: str, user_type: str, mode: controller_pb2.PutMode) -> int:
        user = make_user(name, secret, user_type)  # checked here first: a clear local error
        req = controller_pb2.PutUserRequest(
            user=controller_pb2.AclUser(name=user.name, secret=user.secret, type=user.type.value),
            mode=mode,
        )
        return self._write(lambda s: s.PutUser(req, timeout=CALL_TIMEOUT_S)).version

    def _write(
        self, fn: Callable[[controller_pb2_grpc.ControllerStub], controller_pb2.AclChangeResponse]
    ) -> controller_pb2.AclChangeResponse:
        return self._call(fn, follow_leader=True)

    def _call(
        self, fn: Callable[[controller_pb2_grpc.ControllerStub], _T], follow_leader: bool
    ) -> _T:
        if not self._controllers:
            raise InvalidArgumentError(
                "users and policies live in the controllers: give their addresses "
                "(Admin(controllers=...), raftmq acl --controllers)"
            )
        tried: list[str] = []
        queue = list(self._controllers)
        last: RaftMQError | None = None
        while queue and len(tried) < 2 * len(self._controllers) + 1:
            address = queue.pop(0)
            tried.append(address)
            stub = controller_pb2_grpc.ControllerStub(self._pool.channel(address))
            try:
                return fn(stub)
            except grpc.RpcError as exc:
                err = from_rpc_error(exc)
            if isinstance(err, NotLeaderError) and follow_leader:
                if err.leader_hint and err.leader_hint not in queue:
                    queue.insert(0, err.leader_hint)
                last = err
                continue
            if isinstance(err, (BrokerUnavailableError, NotLeaderError)):
                last = err
                continue
            raise err
        raise last or BrokerUnavailableError(
            f"no controller answered ({', '.join(tried)}); check --controllers"
        )


def _name(u: object) -> str:
    return str(getattr(u, "name", ""))
