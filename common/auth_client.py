"""Signing on the client side (issue 19): a gRPC client interceptor that adds the signed
metadata to every call of a channel, and the signer a client uses by default. The SDK's
ChannelPool and DataPool, the CLI and the nodes' own calls go through here or `Signer` directly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc

from raftmq.common.auth import Credentials, Signer, load_credentials


def client_signer(credentials: Credentials | None = None) -> Signer | None:
    """The signer of an SDK client: its explicit credentials, else RAFTMQ_ACCESS_KEY /
    RAFTMQ_SECRET_KEY or the credentials file; None (unsigned) when there are none."""
    creds = credentials if credentials is not None else load_credentials()
    return None if creds is None else Signer(creds)


class _Details(grpc.ClientCallDetails):
    def __init__(self, base: Any, metadata: tuple[tuple[str, str | bytes], ...]) -> None:
        self.method = base.method
        self.timeout = base.timeout
        self.metadata = metadata
        self.credentials = base.credentials
        self.wait_for_ready = getattr(base, "wait_for_ready", None)
        self.compression = getattr(base, "compression", None)


if TYPE_CHECKING:
    _UnaryUnary = grpc.UnaryUnaryClientInterceptor[Any, Any]
    _UnaryStream = grpc.UnaryStreamClientInterceptor[Any, Any]
else:  # grpc's classes are generic in its stubs only
    _UnaryUnary = grpc.UnaryUnaryClientInterceptor
    _UnaryStream = grpc.UnaryStreamClientInterceptor


class SigningInterceptor(_UnaryUnary, _UnaryStream):
    """Adds x-mq-date-time and authorization to each call (the signature is reused within a
    second: Signer caches it)."""

    def __init__(self, signer: Signer) -> None:
        self._signer = signer

    def _details(self, details: Any) -> _Details:
        return _Details(details, (*(details.metadata or ()), *self._signer.metadata()))

    def intercept_unary_unary(
        self, continuation: Callable[..., Any], details: Any, req: Any
    ) -> Any:
        return continuation(self._details(details), req)

    def intercept_unary_stream(
        self, continuation: Callable[..., Any], details: Any, req: Any
    ) -> Any:
        return continuation(self._details(details), req)


def signed(channel: grpc.Channel, signer: Signer | None) -> grpc.Channel:
    """`channel` with every call signed by `signer`; the channel itself when None."""
    if signer is None:
        return channel
    return grpc.intercept_channel(channel, SigningInterceptor(signer))
