"""Authentication values: RocketMQ 5's signed request (access key, secret key, HMAC-SHA1 of the
request time) for gRPC metadata and the framed protocol's HELLO, and where credentials come from.

The form is the official clients': metadata `x-mq-date-time: yyyyMMdd'T'HHmmss'Z'` and
`authorization: MQv2-HMAC-SHA1 Credential=<AK>, SignedHeaders=x-mq-date-time,
Signature=<hex hmac-sha1(secret, x-mq-date-time)>`. Pure: time is passed in, nothing is logged.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import time
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from raftmq.common.acl import Acl, User
from raftmq.common.errors import InvalidArgumentError, UnauthenticatedError
from raftmq.common.frame import AUTH_HMAC_SHA1
from raftmq.common.settings import setting, settings_class

ALGORITHM = "MQv2-HMAC-SHA1"
DATE_TIME_KEY = "x-mq-date-time"
AUTHORIZATION_KEY = "authorization"
DEFAULT_WINDOW_MS = 15 * 60 * 1000  # RocketMQ's: a signature older or newer than this is refused
ENV_ACCESS_KEY = "RAFTMQ_ACCESS_KEY"
ENV_SECRET_KEY = "RAFTMQ_SECRET_KEY"
ENV_CREDENTIALS_FILE = "RAFTMQ_CREDENTIALS_FILE"
ENV_ADMIN_ACCESS_KEY = "RAFTMQ_ADMIN_ACCESS_KEY"  # a node's admin keys when its settings lack them
ENV_ADMIN_SECRET_KEY = "RAFTMQ_ADMIN_SECRET_KEY"
DEFAULT_CREDENTIALS_FILE = Path("~/.raftmq/credentials.toml")
_FORMAT = "%Y%m%dT%H%M%SZ"
MAX_HEADER_CHARS = 1024


@dataclass(frozen=True, slots=True)
class Credentials:
    access_key: str
    secret_key: str

    def __post_init__(self) -> None:
        if not self.access_key or not self.secret_key:
            raise InvalidArgumentError("credentials need both an access key and a secret key")

    def __repr__(self) -> str:  # never print the secret
        return f"Credentials(access_key={self.access_key!r}, secret_key=***)"


def load_credentials(
    access_key: str | None = None,
    secret_key: str | None = None,
    path: str | Path | None = None,
    env: Mapping[str, str] | None = None,
) -> Credentials | None:
    """The credentials to sign with: the arguments, else RAFTMQ_ACCESS_KEY / RAFTMQ_SECRET_KEY,
    else a file (`path`, RAFTMQ_CREDENTIALS_FILE or ~/.raftmq/credentials.toml) holding
    `access_key = "..."` and `secret_key = "..."`. None when nothing gives any (an open cluster)."""
    env = os.environ if env is None else env
    if access_key or secret_key:
        return Credentials(access_key or "", secret_key or "")
    if env.get(ENV_ACCESS_KEY) or env.get(ENV_SECRET_KEY):
        return Credentials(env.get(ENV_ACCESS_KEY, ""), env.get(ENV_SECRET_KEY, ""))
    explicit = path or env.get(ENV_CREDENTIALS_FILE)
    file = Path(explicit or DEFAULT_CREDENTIALS_FILE).expanduser()
    if not file.exists():
        if explicit:
            raise InvalidArgumentError(f"credentials file {file} does not exist")
        return None
    try:
        raw = tomllib.loads(file.read_text())
        return Credentials(str(raw["access_key"]), str(raw["secret_key"]))
    except (OSError, tomllib.TOMLDecodeError, KeyError) as exc:
        raise InvalidArgumentError(
            f'credentials file {file} must hold access_key = "..." and secret_key = "...": {exc}'
        ) from None


@settings_class
class AuthSettings:
    """[security.auth]'s keys, the same on every role (issue 19): the base of each role's
    settings class (their tables list a role's own keys first, these after)."""

    auth_enabled: bool = setting(
        default=False,
        unit="",
        doc="check a signed request (access key, HMAC) and the ACL on every call",
    )
    auth_admin_access_key: str = setting(
        default="",
        unit="",
        doc='the admin (super) user the nodes sign with; "" = env RAFTMQ_ADMIN_ACCESS_KEY',
    )
    auth_admin_secret_key: str = setting(
        default="",
        unit="",
        doc='the admin\'s secret key; "" = env RAFTMQ_ADMIN_SECRET_KEY (keeps it off the command '
        "line); never printed",
        secret=True,
    )
    auth_window_ms: int = setting(
        default=900_000,
        unit="ms",
        doc="a signature made further than this from the server's clock is refused (replay)",
    )
    acl_refresh_ms: int = setting(
        default=2_000,
        unit="ms",
        doc="how often the node fetches the users and policies from the controllers",
    )


def check_auth_settings(settings: AuthSettings, controllers: str) -> None:
    """A role's auth settings, checked when they are loaded (ValueError names the fix):
    `controllers` is where the node gets the users and policies ("" = nowhere)."""
    if not settings.auth_enabled:
        return
    ak = settings.auth_admin_access_key or os.environ.get(ENV_ADMIN_ACCESS_KEY)
    sk = settings.auth_admin_secret_key or os.environ.get(ENV_ADMIN_SECRET_KEY)
    if not ak or not sk:
        raise ValueError(
            "auth_enabled needs the admin's keys: auth_admin_access_key and "
            f"auth_admin_secret_key, or {ENV_ADMIN_ACCESS_KEY} / {ENV_ADMIN_SECRET_KEY}"
        )
    if not controllers.strip():
        raise ValueError(
            "auth_enabled needs the controllers' addresses (the users and policies are their "
            "replicated state): controller_addresses (broker) or acl_controller_addresses"
        )
    for key, value in (
        ("auth_window_ms", settings.auth_window_ms),
        ("acl_refresh_ms", settings.acl_refresh_ms),
    ):
        if value <= 0:
            raise ValueError(f"{key} must be > 0")


def date_time(now_ms: int) -> str:
    return datetime.fromtimestamp(now_ms / 1000, UTC).strftime(_FORMAT)


def sign(secret_key: str, when: str) -> str:
    return hmac.new(secret_key.encode(), when.encode(), hashlib.sha1).hexdigest()


def authorization(creds: Credentials, when: str) -> str:
    return (
        f"{ALGORITHM} Credential={creds.access_key}, SignedHeaders={DATE_TIME_KEY}, "
        f"Signature={sign(creds.secret_key, when)}"
    )


class Signer:
    """gRPC metadata for one client's calls; the signature is computed once per second (the
    date-time's resolution), not per call."""

    def __init__(self, creds: Credentials, clock_ms: Callable[[], int] | None = None) -> None:
        self.creds = creds
        self._clock_ms = clock_ms or (lambda: time.time_ns() // 1_000_000)
        self._cached: tuple[int, tuple[tuple[str, str], ...]] = (-1, ())

    def metadata(self) -> tuple[tuple[str, str], ...]:
        now_ms = self._clock_ms()
        second = now_ms // 1000
        cached = self._cached
        if cached[0] != second:
            when = date_time(now_ms)
            cached = self._cached = (
                second,
                ((DATE_TIME_KEY, when), (AUTHORIZATION_KEY, authorization(self.creds, when))),
            )
        return cached[1]

    def hello_auth(self) -> tuple[int, bytes]:
        """The framed HELLO's (auth_method, auth bytes): access key, date-time, signature."""
        when = date_time(self._clock_ms())
        return AUTH_HMAC_SHA1, "\n".join(
            (self.creds.access_key, when, sign(self.creds.secret_key, when))
        ).encode()


def call_metadata(signer: Signer | None) -> tuple[tuple[str, str], ...] | None:
    """The `metadata=` of a gRPC call: signed when there is a signer, none otherwise."""
    return None if signer is None else signer.metadata()


@dataclass(frozen=True, slots=True)
class SignedRequest:
    access_key: str
    when: str
    signature: str


def parse_authorization(header: str, when: str) -> SignedRequest:
    """The parts of an `authorization` header; UnauthenticatedError when it is not our form."""
    if len(header) > MAX_HEADER_CHARS:
        raise UnauthenticatedError(f"authorization header longer than {MAX_HEADER_CHARS} chars")
    algorithm, _, rest = header.strip().partition(" ")
    if algorithm != ALGORITHM:
        raise UnauthenticatedError(
            f"authorization algorithm {algorithm[:40]!r} is not {ALGORITHM}; sign requests with "
            "an access key and secret key"
        )
    parts: dict[str, str] = {}
    for item in rest.split(","):
        key, sep, value = item.strip().partition("=")
        if sep:
            parts[key] = value.strip()
    missing = {"Credential", "Signature"} - set(parts)
    if missing:
        raise UnauthenticatedError(f"authorization header lacks {', '.join(sorted(missing))}")
    if parts.get("SignedHeaders", DATE_TIME_KEY).lower() != DATE_TIME_KEY:
        raise UnauthenticatedError(f"SignedHeaders must be {DATE_TIME_KEY}")
    return SignedRequest(parts["Credential"], when, parts["Signature"])


def parse_hello_auth(auth_method: int, auth: bytes) -> SignedRequest:
    if auth_method != AUTH_HMAC_SHA1:
        raise UnauthenticatedError(
            f"auth method {auth_method} is not supported; this server needs HMAC-SHA1 "
            f"({AUTH_HMAC_SHA1}) with an access key and secret key"
        )
    try:
        access_key, when, signature = auth.decode("ascii").split("\n")
    except (UnicodeDecodeError, ValueError):
        raise UnauthenticatedError(
            "the HELLO's auth is not access key, date-time and signature"
        ) from None
    return SignedRequest(access_key, when, signature)


def signed_at_ms(when: str) -> int:
    try:
        return int(datetime.strptime(when, _FORMAT).replace(tzinfo=UTC).timestamp() * 1000)
    except ValueError:
        raise UnauthenticatedError(
            f"{DATE_TIME_KEY} {when[:40]!r} is not yyyyMMdd'T'HHmmss'Z' (UTC)"
        ) from None


def check_window(req: SignedRequest, now_ms: int, window_ms: int) -> None:
    """Refuse a signature made more than `window_ms` from now (either way): a replay, or a
    client whose clock is off."""
    if abs(now_ms - signed_at_ms(req.when)) > window_ms:
        raise UnauthenticatedError(
            f"the request was signed at {req.when}, more than {window_ms // 1000} s from this "
            "server's clock: refused as a replay (sign each request afresh; check the clocks)",
            details={"signed_at": req.when},
        )


def verify(
    req: SignedRequest,
    acl: Acl,
    admin: User | None,
    now_ms: int,
    window_ms: int = DEFAULT_WINDOW_MS,
) -> str:
    """The subject (user name) a signed request speaks for; UnauthenticatedError when the user
    is unknown, the signature does not match or the time is outside the window (a replay)."""
    check_window(req, now_ms, window_ms)
    user = acl.user(req.access_key, admin)
    # Hex in either case: the Python client signs in lower case, the Java and Node.js clients
    # in upper case (Node's rocketmq-client-nodejs: digest('hex').toUpperCase()).
    given = req.signature.lower().encode()
    if user is None or not hmac.compare_digest(sign(user.secret, req.when).encode(), given):
        # one message for both: do not tell a prober which access keys exist
        raise UnauthenticatedError(
            f"access key {req.access_key[:64]!r} is unknown or the signature does not match its "
            "secret key",
            details={"access_key": req.access_key[:64]},
        )
    return user.name
