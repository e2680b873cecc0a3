"""The dashboard's login (issue 27): users and their roles from the cluster's ACL model (a super
user is an admin, any other user may only read), sessions as signed cookies, and the CSRF token
each session's forms carry.

Pure: time comes in as `now_ms`; no sockets, no pages. Never stores, logs or returns a secret key.
"""

from __future__ import annotations

import base64
import enum
import hashlib
import hmac
import secrets
from dataclasses import dataclass

from raftmq.common.acl import Acl, User, UserType

COOKIE = "raftmq_session"
DEFAULT_TTL_MS = 8 * 3600 * 1000  # a working day; then the user signs in again
MAX_COOKIE_CHARS = 512  # a longer one is not ours: refused before any decoding


class Role(enum.Enum):
    ADMIN = "admin"  # may act (with --allow-actions): a super user of the ACL
    READ_ONLY = "read-only"


@dataclass(frozen=True, slots=True)
class Session:
    user: str
    role: Role
    expires_ms: int
    nonce: str  # per sign-in: a new sign-in gets a new CSRF token


def authenticate(acl: Acl, admin: User | None, access_key: str, secret_key: str) -> Role | None:
    """The role of a user whose secret matches, else None (unknown and wrong alike)."""
    user = acl.user(access_key, admin)
    if user is None:
        hmac.compare_digest(secret_key.encode(), b"-")  # about the same time either way
        return None
    if not hmac.compare_digest(secret_key.encode(), user.secret.encode()):
        return None
    return Role.ADMIN if user.type is UserType.SUPER else Role.READ_ONLY


class Sessions:
    """Issues and checks session cookies: `user|role|expires|nonce` and an HMAC-SHA256 of it
    under a key of this process (a restart signs everyone out)."""

    def __init__(self, key: bytes | None = None, ttl_ms: int = DEFAULT_TTL_MS) -> None:
        self._key = key or secrets.token_bytes(32)
        self.ttl_ms = ttl_ms

    def _mac(self, what: bytes) -> str:
        return hmac.new(self._key, what, hashlib.sha256).hexdigest()

    def issue(self, user: str, role: Role, now_ms: int) -> str:
        body = "|".join((user, role.value, str(now_ms + self.ttl_ms), secrets.token_hex(8)))
        raw = base64.urlsafe_b64encode(body.encode()).decode().rstrip("=")
        return f"{raw}.{self._mac(raw.encode())}"

    def check(self, cookie: str | None, now_ms: int) -> Session | None:
        if not cookie or len(cookie) > MAX_COOKIE_CHARS:
            return None
        raw, _, mac = cookie.partition(".")
        if not hmac.compare_digest(
            mac.encode("utf-8", "replace"), self._mac(raw.encode()).encode()
        ):
            return None
        try:
            body = base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)).decode()
            user, role, expires, nonce = body.rsplit("|", 3)
            session = Session(user, Role(role), int(expires), nonce)
        except ValueError:  # ours and signed, so only an older format could get here
            return None
        return session if now_ms < session.expires_ms else None

    def csrf(self, session: Session) -> str:
        """The token a session's forms carry (and its POSTs must): bound to the session's
        sign-in, so a page of another site, which cannot read it, cannot post for the user."""
        return self._mac(f"csrf|{session.user}|{session.nonce}".encode())[:32]

    def csrf_ok(self, session: Session, token: str) -> bool:
        return hmac.compare_digest(token.encode("utf-8", "replace"), self.csrf(session).encode())
