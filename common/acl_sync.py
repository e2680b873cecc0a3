"""A node's copy of the ACL (issue 19): a thread that asks the controllers for the current
snapshot every `refresh_ms` (GetAcl with the version it holds, so an unchanged ACL costs one
small call) and keeps the newest. Requests are checked against `current()`, never waiting on
the controllers: a change reaches every node within about one refresh interval (bounded
staleness, docs/design.md). If no controller answers, the last snapshot stays in force and the
admin user always works; a node that never got one knows only the admin.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from raftmq.common import tls
from raftmq.common.acl import Acl
from raftmq.common.auth import ENV_ADMIN_ACCESS_KEY, ENV_ADMIN_SECRET_KEY, Credentials, Signer
from raftmq.common.auth_guard import AuthConfig, AuthInterceptor, Guard
from raftmq.common.errors import InvalidArgumentError
from raftmq.common.grpc_options import CHANNEL_LIVENESS
from raftmq.common.pb import controller_pb2, controller_pb2_grpc

_log = logging.getLogger("auth.acl_sync")

CALL_TIMEOUT_S = 2.0


def auth_config_of(settings: object) -> AuthConfig:
    """A role's AuthConfig from its settings (auth_enabled, auth_admin_access_key,
    auth_admin_secret_key, auth_window_ms); empty keys come from RAFTMQ_ADMIN_ACCESS_KEY and
    RAFTMQ_ADMIN_SECRET_KEY, so the secret need not be on a command line."""
    enabled = bool(getattr(settings, "auth_enabled", False))
    ak = str(getattr(settings, "auth_admin_access_key", "")) or os.environ.get(
        ENV_ADMIN_ACCESS_KEY, ""
    )
    sk = str(getattr(settings, "auth_admin_secret_key", "")) or os.environ.get(
        ENV_ADMIN_SECRET_KEY, ""
    )
    return AuthConfig.of(enabled, ak, sk, int(getattr(settings, "auth_window_ms", 900_000)))


def admin_credentials(config: AuthConfig) -> Credentials | None:
    """The admin's credentials when auth is on (what a node's SDK clients sign with)."""
    if not config.enabled or config.admin is None:
        return None
    return Credentials(config.admin.name, config.admin.secret)


def admin_signer(config: AuthConfig) -> Signer | None:
    """What a node signs its own calls to other nodes with (the admin user), None when off."""
    if not config.enabled or config.admin is None:
        return None
    return Signer(Credentials(config.admin.name, config.admin.secret))


class AclSync:
    """Keeps the newest ACL snapshot from `controllers`; `current()` is a lock-free read."""

    def __init__(self, controllers: Sequence[str], signer: Signer, refresh_ms: int) -> None:
        if not controllers:
            raise InvalidArgumentError(
                "auth_enabled needs the controllers' addresses: the users and policies live "
                "in their replicated state"
            )
        self._addresses = tuple(controllers)
        self._signer = signer
        self._refresh_s = refresh_ms / 1000
        self._acl = Acl()
        self._stop = threading.Event()
        self._channels: dict[str, grpc.Channel] = {}
        self._next = 0
        self.failures = 0
        self._thread = threading.Thread(target=self._run, name="acl-sync", daemon=True)

    def current(self) -> Acl:
        return self._acl

    def start(self) -> None:
        self.refresh()  # try once before serving: the first requests see the users
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        for ch in self._channels.values():
            ch.close()

    def refresh(self) -> bool:
        """Ask the controllers (from the one that answered last) until one answers."""
        for i in range(len(self._addresses)):
            address = self._addresses[(self._next + i) % len(self._addresses)]
            try:
                self._fetch(address)
            except grpc.RpcError as exc:
                _log.debug("acl.fetch_failed controller=%s code=%s", address, exc.code())
                continue
            self._next = (self._next + i) % len(self._addresses)
            return True
        self.failures += 1
        if self.failures == 1 or self.failures % 30 == 0:
            _log.warning(
                "acl.no_controller_answered controllers=%s version=%d failures=%d; the last "
                "snapshot stays in force",
                ",".join(self._addresses),
                self._acl.version,
                self.failures,
            )
        return False

    def _fetch(self, address: str) -> None:
        ch = self._channels.get(address)
        if ch is None:
            # TLS when the process has it (common/tls.py), the one way channels are made
            ch = self._channels[address] = tls.channel(address, CHANNEL_LIVENESS)
        stub = controller_pb2_grpc.ControllerStub(ch)
        held = self._acl
        out = stub.GetAcl(
            controller_pb2.GetAclRequest(known_version=held.version),
            timeout=CALL_TIMEOUT_S,
            metadata=self._signer.metadata(),
        )
        if out.unchanged or out.version <= held.version:
            return  # a lagging controller never takes a node back to an older version
        self._acl = Acl.from_json(out.snapshot)
        _log.info("acl.updated version=%d users=%d", self._acl.version, len(self._acl.users))

    def _run(self) -> None:
        while not self._stop.wait(self._refresh_s):
            try:
                self.refresh()
            except Exception:  # a bad snapshot must not end the thread; keep the last one
                _log.exception("acl.refresh_failed")


class NodeSecurity:
    """A node's auth pieces (issue 19), inert when auth is off: `signer` for its own calls to
    other nodes, `guard` for requests it serves, and the ACL sync behind the guard."""

    def __init__(
        self,
        config: AuthConfig,
        controllers: Sequence[str] = (),
        refresh_ms: int = 2_000,
        local_acl: Callable[[], Acl] | None = None,
    ) -> None:
        self.config = config
        self.signer = admin_signer(config)
        self.sync: AclSync | None = None
        self.guard: Guard | None = None
        if not config.enabled:
            return
        assert self.signer is not None
        if local_acl is None:
            self.sync = AclSync(controllers, self.signer, refresh_ms)
            local_acl = self.sync.current
        self.guard = Guard(config, local_acl)

    @classmethod
    def for_settings(
        cls,
        settings: object,
        controllers: Sequence[str],
        local_acl: Callable[[], Acl] | None = None,
    ) -> NodeSecurity:
        return cls(
            auth_config_of(settings),
            controllers,
            int(getattr(settings, "acl_refresh_ms", 2_000)),
            local_acl,
        )

    def interceptors(self, services: Sequence[Any]) -> list[grpc.ServerInterceptor[Any, Any]]:
        return [] if self.guard is None else [AuthInterceptor(self.guard, services)]

    def start(self) -> None:
        if self.sync is not None:
            self.sync.start()

    def close(self) -> None:
        if self.sync is not None:
            self.sync.close()
