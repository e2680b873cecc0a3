"""Registration of a broker node with every NameServer: at start, every heartbeat interval, and
at once when its role or topic table changes (so routes follow a failover without waiting).

I/O only: what to register comes from a callable; NameServers are independent, so each is called
in parallel and a dead one never delays the others.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent import futures

import grpc

from raftmq.common import tls
from raftmq.common.auth import Signer, call_metadata
from raftmq.common.grpc_options import CHANNEL_LIVENESS
from raftmq.common.pb import namesrv_pb2, namesrv_pb2_grpc

log = logging.getLogger("broker.registration")

CALL_TIMEOUT_S = 3.0
FAILURE_LOG_INTERVAL_S = 30.0  # a dead NameServer is reported at most this often


class Registrar:
    """One thread that registers the node with every NameServer; poke() registers at once."""

    def __init__(
        self,
        namesrv_addresses: tuple[str, ...],
        request: Callable[[], namesrv_pb2.RegisterBrokerRequest],
        interval_ms: int,
        signer: Signer | None = None,
    ) -> None:
        self._signer = signer  # signs the calls when auth is on (issue 19)
        self._addresses = namesrv_addresses
        self._request = request
        self._interval_s = interval_ms / 1000
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._channels = {a: tls.channel(a, CHANNEL_LIVENESS) for a in namesrv_addresses}
        self._stubs = {a: namesrv_pb2_grpc.NameServerStub(c) for a, c in self._channels.items()}
        self._pool = futures.ThreadPoolExecutor(
            max_workers=max(1, len(namesrv_addresses)), thread_name_prefix="broker-register"
        )
        self._last_failure_log: dict[str, float] = {}
        self._thread = threading.Thread(target=self._run, name="broker-registrar", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def poke(self) -> None:
        self._wake.set()

    def stop(self, unregister: namesrv_pb2.UnregisterBrokerRequest | None) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=CALL_TIMEOUT_S + 1)
        if unregister is not None:
            calls = [self._pool.submit(self._unregister, a, unregister) for a in self._addresses]
            futures.wait(calls, timeout=CALL_TIMEOUT_S + 1)
        self._pool.shutdown(wait=False, cancel_futures=True)
        for ch in self._channels.values():
            ch.close()

    def register_once(self) -> int:
        """Register with every NameServer in parallel; the number that accepted."""
        req = self._request()
        calls = [self._pool.submit(self._register, a, req) for a in self._addresses]
        done, _ = futures.wait(calls, timeout=CALL_TIMEOUT_S + 1)
        return sum(1 for f in done if f.result())

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            try:
                self.register_once()
            except Exception:
                log.exception("broker.register_failed")
            self._wake.wait(self._interval_s)

    def _register(self, address: str, req: namesrv_pb2.RegisterBrokerRequest) -> bool:
        try:
            self._stubs[address].RegisterBroker(
                req, timeout=CALL_TIMEOUT_S, metadata=call_metadata(self._signer)
            )
        except grpc.RpcError as exc:
            now = time.monotonic()
            if now - self._last_failure_log.get(address, -1e9) >= FAILURE_LOG_INTERVAL_S:
                self._last_failure_log[address] = now
                log.warning("broker.register_failed namesrv=%s status=%s", address, _status(exc))
            return False
        self._last_failure_log.pop(address, None)
        return True

    def _unregister(self, address: str, req: namesrv_pb2.UnregisterBrokerRequest) -> None:
        try:
            self._stubs[address].UnregisterBroker(
                req, timeout=CALL_TIMEOUT_S, metadata=call_metadata(self._signer)
            )
        except grpc.RpcError as exc:
            log.warning("broker.unregister_failed namesrv=%s status=%s", address, _status(exc))


def _status(exc: grpc.RpcError) -> str:
    code = getattr(exc, "code", None)
    return str(code()) if callable(code) else type(exc).__name__
