"""Transport security, the one way to make a channel or a listening port: TLS settings (files),
validated once, turned into gRPC credentials and ssl.SSLContexts for the framed data path and
HTTP. A process's own TLS material is installed once at startup, before any channel exists.

Never reads a key on the hot path; never falls back to plaintext when TLS was asked for.
"""

from __future__ import annotations

import logging
import ssl
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from raftmq.common.settings import SettingsError, load_settings, setting, settings_class

_log = logging.getLogger("tls")
ENV_PREFIX = "RAFTMQ_TLS_"
CERTS_HINT = (
    "run `raftmq cluster certs --spec <cluster.toml>` to make a development CA and certificates"
)
ChannelOptions = Sequence[tuple[str, Any]]


@settings_class
class TlsSettings:
    """Flags `--tls-<key>` of every server process and of the CLI; env RAFTMQ_TLS_<KEY>."""

    ca: str = setting(
        default="",
        unit="path",
        doc='CA certificate (PEM) that signs every node; "" = TLS off (plaintext)',
    )
    cert: str = setting(
        default="", unit="path", doc="this process's certificate (PEM); servers need one"
    )
    key: str = setting(default="", unit="path", doc="the private key of cert (PEM)")
    require_client_cert: bool = setting(
        default=False,
        unit="bool",
        doc="servers: mutual TLS, refuse a client without a certificate signed by the CA",
    )
    raft_key: str = setting(
        default="",
        unit="path",
        doc="file holding the shared Raft secret (it seals the Raft ports' frames)",
    )


@dataclass(frozen=True, slots=True)
class Tls:
    """Loaded, checked TLS material of one process (or one SDK client)."""

    ca_file: Path
    ca_pem: bytes
    cert_file: Path | None
    key_file: Path | None
    cert_pem: bytes | None
    key_pem: bytes | None
    require_client_cert: bool = False
    raft_password: str | None = None  # from raft_key: encrypts the Raft port (see design.md)

    # ---- gRPC ---------------------------------------------------------------------------------

    def server_credentials(self) -> grpc.ServerCredentials:
        if self.cert_pem is None or self.key_pem is None:
            raise SettingsError(
                "a TLS server needs a certificate and key (--tls-cert, --tls-key); " + CERTS_HINT
            )
        return grpc.ssl_server_credentials(
            [(self.key_pem, self.cert_pem)],
            root_certificates=self.ca_pem,
            require_client_auth=self.require_client_cert,
        )

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca_pem,
            private_key=self.key_pem,
            certificate_chain=self.cert_pem,
        )

    # ---- ssl (framed data path, HTTP) ---------------------------------------------------------

    def server_context(self) -> ssl.SSLContext:
        if self.cert_file is None or self.key_file is None:
            raise SettingsError(
                "a TLS server needs a certificate and key (--tls-cert, --tls-key); " + CERTS_HINT
            )
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cadata=self.ca_pem.decode())
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.cert_file, self.key_file)
        ctx.verify_mode = ssl.CERT_REQUIRED if self.require_client_cert else ssl.CERT_OPTIONAL
        return ctx

    def client_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=self.ca_pem.decode())
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.cert_file is not None and self.key_file is not None:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        return ctx


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise SettingsError(f"TLS {what} file {path} does not exist; {CERTS_HINT}") from None
    except OSError as exc:
        raise SettingsError(f"cannot read TLS {what} file {path}: {exc.strerror or exc}") from None


def from_settings(s: TlsSettings) -> Tls | None:
    """The checked material, or None when TLS is off (no CA). A missing or unreadable file, a
    certificate without its key, or a key the certificate does not match: SettingsError."""
    if not s.ca:
        if s.cert or s.key or s.require_client_cert:
            raise SettingsError(
                "TLS cert/key/require_client_cert given without a CA (--tls-ca / RAFTMQ_TLS_CA)"
            )
        return None
    if bool(s.cert) != bool(s.key):
        raise SettingsError("TLS needs both a certificate and its key (--tls-cert and --tls-key)")
    ca_file = Path(s.ca)
    ca_pem = _read(ca_file, "CA certificate")
    cert_file = Path(s.cert) if s.cert else None
    key_file = Path(s.key) if s.key else None
    cert_pem = _read(cert_file, "certificate") if cert_file else None
    key_pem = _read(key_file, "private key") if key_file else None
    try:  # every mismatch found now, at startup, with the file names
        ctx = ssl.create_default_context(cadata=ca_pem.decode())
        if cert_file is not None and key_file is not None:
            ctx.load_cert_chain(cert_file, key_file)
    except (ssl.SSLError, ValueError) as exc:
        raise SettingsError(
            f"TLS files {ca_file}, {cert_file}, {key_file} do not fit together: {exc}; "
            + CERTS_HINT
        ) from None
    raft_password = None
    if s.raft_key:
        raft_password = _read(Path(s.raft_key), "Raft secret").decode().strip() or None
    return Tls(
        ca_file,
        ca_pem,
        cert_file,
        key_file,
        cert_pem,
        key_pem,
        s.require_client_cert,
        raft_password,
    )


def load(
    overrides: Mapping[str, object] | None = None, environ: Mapping[str, str] | None = None
) -> Tls | None:
    """TLS from RAFTMQ_TLS_* variables < `overrides` (flags, SDK arguments)."""
    return from_settings(load_settings(TlsSettings, None, ENV_PREFIX, overrides, environ=environ))


# ---- the process's own material ------------------------------------------------------------------
# One per process (its identity, like its host name), installed by the process's main before any
# server or channel exists and read-only afterwards; the servers' deep call sites (registration,
# role reports, the controller's pushes) use it without threading it through every constructor.

_installed: list[Tls | None] = []
_install_lock = threading.Lock()


def install(tls: Tls | None) -> None:
    with _install_lock:
        _installed[:] = [tls]


def uninstall() -> None:
    """Back to RAFTMQ_TLS_* (tests that installed material in their own process)."""
    with _install_lock:
        _installed.clear()


def process_tls() -> Tls | None:
    """The installed material; before install(), what RAFTMQ_TLS_* says (SDK users, CLI)."""
    with _install_lock:
        if _installed:
            return _installed[0]
    return load()


PROCESS: Any = object()  # "use process_tls()" default of the helpers below


def resolve(tls: Tls | Any | None) -> Tls | None:
    return process_tls() if tls is PROCESS else tls


def channel(
    address: str, options: ChannelOptions | None = None, tls: Tls | Any | None = PROCESS
) -> grpc.Channel:
    """The one way to open a gRPC channel: TLS when the process (or `tls`) has a CA."""
    t = resolve(tls)
    opts = list(options or ())
    if t is None:
        return grpc.insecure_channel(address, options=opts)
    return grpc.secure_channel(address, t.channel_credentials(), options=opts)


def add_port(
    server: grpc.Server | grpc.aio.Server, listen: str, tls: Tls | Any | None = PROCESS
) -> int:
    """The one way to open a gRPC server's port; the bound port (0 = could not bind)."""
    t = resolve(tls)
    if t is None:
        return server.add_insecure_port(listen)
    return server.add_secure_port(listen, t.server_credentials())


def server_ssl(tls: Tls | Any | None = PROCESS) -> ssl.SSLContext | None:
    t = resolve(tls)
    return None if t is None else t.server_context()


def client_ssl(tls: Tls | Any | None = PROCESS) -> ssl.SSLContext | None:
    t = resolve(tls)
    return None if t is None else t.client_context()


def client_tls(
    ca: str | None = None, cert: str | None = None, key: str | None = None
) -> Tls | None:
    """SDK arguments -> the material for ChannelPool/DataPool: exactly these files when any is
    given, else the process default (installed, or RAFTMQ_TLS_*). Bad files raise
    InvalidArgumentError."""
    from raftmq.common.errors import InvalidArgumentError

    try:
        if ca is None and cert is None and key is None:
            return process_tls()
        return load({"ca": ca, "cert": cert, "key": key}, environ={})
    except SettingsError as exc:
        raise InvalidArgumentError(str(exc)) from None


def raft_password() -> str | None:
    """The Raft port's shared secret when TLS is on (it seals the Raft frames; design.md says
    why the Raft port is not TLS itself)."""
    t = process_tls()
    return None if t is None else t.raft_password


def enabled(tls: Tls | Any | None = PROCESS) -> bool:
    return resolve(tls) is not None


def scheme(tls: Tls | Any | None = PROCESS) -> str:
    """The URL scheme of the metrics, health and dashboard servers: https with TLS."""
    return "https" if enabled(tls) else "http"
