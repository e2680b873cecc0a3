"""Who may read a role's /metrics and over which TLS (issue 27): the settings keys every role with
a metrics port shares, the check of a scrape's Authorization header, as Prometheus' scrape config
sends it (`basic_auth` or `authorization: {credentials}`, a bearer token), and the port's own
choice of TLS: as the process, server-only, mutual or off.

The check is pure (no sockets, no clocks) and never logs or echoes a credential.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hmac
import ssl
from dataclasses import dataclass
from typing import Any

from raftmq.common import tls
from raftmq.common.fair_share import FairShareSettings, check_fair_share_settings
from raftmq.common.settings import SettingsError, setting, settings_class

TLS_MODES = ("", "off", "server-only", "mutual")
METRICS_OFF = "off"
OPEN_PATHS = frozenset({"/healthz"})  # a liveness probe needs no secret (Kubernetes' kubelet)


@settings_class
class ScrapeSettings(FairShareSettings):
    """The keys of every role that serves /metrics, beyond the fair share's (its base)."""

    metrics_tls: str = setting(
        default="",
        unit="",
        doc='/metrics, /readyz, /healthz: "" = as the process (TLS when it has a CA, mutual as '
        '--tls-require-client-cert), "server-only", "mutual", or "off" (plain HTTP)',
    )
    metrics_basic_auth_user: str = setting(
        default="",
        unit="",
        doc="/metrics and /readyz ask HTTP basic auth of this user (Prometheus' basic_auth); "
        '"" = no basic auth',
    )
    metrics_basic_auth_password: str = setting(
        default="", unit="", doc="the basic auth user's password; never printed", secret=True
    )
    metrics_bearer_token: str = setting(
        default="",
        unit="",
        doc="/metrics and /readyz ask this bearer token (Prometheus' authorization "
        'credentials); "" = none; never printed',
        secret=True,
    )

    def __post_init__(self) -> None:  # a role's own __post_init__ calls the check itself
        check_scrape_settings(self)


def check_scrape_settings(s: ScrapeSettings) -> None:
    check_fair_share_settings(s)
    if s.metrics_tls not in TLS_MODES:
        raise ValueError(
            f"metrics_tls {s.metrics_tls!r} is not one of " + ", ".join(repr(m) for m in TLS_MODES)
        )
    if bool(s.metrics_basic_auth_user) != bool(s.metrics_basic_auth_password):
        raise ValueError(
            "metrics_basic_auth_user and metrics_basic_auth_password go together (the password "
            "from RAFTMQ_<ROLE>_METRICS_BASIC_AUTH_PASSWORD keeps it off the command line)"
        )
    if s.metrics_basic_auth_user and s.metrics_bearer_token:
        raise ValueError("give metrics_basic_auth_* or metrics_bearer_token, not both")
    if ":" in s.metrics_basic_auth_user:
        raise ValueError("metrics_basic_auth_user may not contain ':' (HTTP basic auth)")


def check_metrics_listen(value: str, what: str = "metrics_listen") -> None:
    """'' or 'off' (no endpoint) or host:port, port 0 = any free port."""
    if value in ("", METRICS_OFF):
        return
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{what} {value!r} is not host:port (port 0 = any free port), '' or 'off'")


def metrics_bind(value: str) -> tuple[str, int] | None:
    """(host, port) of a checked metrics_listen value; None when off."""
    if value in ("", METRICS_OFF):
        return None
    host, _, port = value.rpartition(":")
    return host.strip("[]"), int(port)


@dataclass(frozen=True, slots=True)
class ScrapeAccess:
    """What a scrape must present; both empty = anyone may read."""

    basic: bytes = b""  # "user:password", as the Basic scheme carries it
    bearer: bytes = b""

    @classmethod
    def from_settings(cls, s: ScrapeSettings) -> ScrapeAccess:
        basic = ""
        if s.metrics_basic_auth_user:
            basic = f"{s.metrics_basic_auth_user}:{s.metrics_basic_auth_password}"
        return cls(basic.encode(), s.metrics_bearer_token.encode())

    @property
    def open(self) -> bool:
        return not self.basic and not self.bearer

    @property
    def challenge(self) -> str:
        """The WWW-Authenticate header of a 401."""
        return 'Basic realm="raftmq metrics"' if self.basic else 'Bearer realm="raftmq metrics"'

    def allows(self, path: str, authorization: str | None) -> bool:
        if self.open or path in OPEN_PATHS:
            return True
        scheme, _, value = (authorization or "").strip().partition(" ")
        value = value.strip()
        if self.basic and scheme.lower() == "basic":
            try:
                given = base64.b64decode(value.encode("ascii"), validate=True)
            except (binascii.Error, UnicodeEncodeError):
                return False
            return hmac.compare_digest(given, self.basic)
        if self.bearer and scheme.lower() == "bearer":
            return hmac.compare_digest(value.encode("utf-8", "replace"), self.bearer)
        return False


def scrape_ssl(mode: str, material: tls.Tls | Any | None = tls.PROCESS) -> ssl.SSLContext | None:
    """The metrics port's TLS: the process's material (or `material`: the dashboard serves its
    own certificate) with this port's client-cert choice. SettingsError when TLS is asked of a
    process that has none."""
    t = tls.resolve(material)
    if mode == "off":
        return None
    if t is None:
        if mode:
            raise SettingsError(
                f"metrics_tls {mode!r} needs the process's TLS (--tls-ca, --tls-cert, "
                f"--tls-key; [security.tls] in a cluster description); {tls.CERTS_HINT}"
            )
        return None
    if mode:
        t = dataclasses.replace(t, require_client_cert=mode == "mutual")
    return t.server_context()
