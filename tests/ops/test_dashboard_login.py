"""The dashboard's sign-in core (ops/dashboard/login.py), without a server: the roles come from
the ACL (a super user is an admin, the description's admin too, anyone else reads), a session
cookie verifies only as issued and until it expires, and the CSRF token is bound to one sign-in."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from raftmq.common.acl import Acl, User, UserType
from raftmq.ops.dashboard.login import Role, Sessions, authenticate

ACL = Acl(3, {"alice": User("alice", "a-secret"), "root": User("root", "r-secret", UserType.SUPER)})
ADMIN = User("ops-admin", "ops-secret", UserType.SUPER)


def test_roles_come_from_the_acl_and_a_wrong_secret_is_no_role() -> None:
    assert authenticate(ACL, ADMIN, "alice", "a-secret") is Role.READ_ONLY
    assert authenticate(ACL, ADMIN, "root", "r-secret") is Role.ADMIN
    assert authenticate(ACL, ADMIN, "ops-admin", "ops-secret") is Role.ADMIN
    for key, secret in (("alice", "r-secret"), ("ghost", "x"), ("alice", ""), ("", "")):
        assert authenticate(ACL, ADMIN, key, secret) is None
    assert authenticate(ACL, None, "ops-admin", "ops-secret") is None  # auth's admin only


def test_a_session_lasts_its_ttl_and_survives_no_other_key() -> None:
    s = Sessions(b"k" * 32, ttl_ms=1000)
    cookie = s.issue("ali|ce", Role.READ_ONLY, 5_000)
    got = s.check(cookie, 5_999)
    assert got is not None and (got.user, got.role) == ("ali|ce", Role.READ_ONLY)
    assert s.check(cookie, 6_000) is None  # expired
    assert Sessions(b"j" * 32).check(cookie, 5_500) is None  # another process's key
    assert s.check(None, 0) is None and s.check("x" * 600, 0) is None


def test_the_csrf_token_is_bound_to_one_sign_in() -> None:
    s = Sessions(b"k" * 32)
    one = s.check(s.issue("alice", Role.ADMIN, 0), 1)
    two = s.check(s.issue("alice", Role.ADMIN, 0), 1)
    assert one is not None and two is not None
    assert s.csrf_ok(one, s.csrf(one)) and not s.csrf_ok(one, s.csrf(two))
    assert not s.csrf_ok(one, "") and not s.csrf_ok(one, "é")


@given(st.data())
def test_any_change_to_a_cookie_is_refused(data: st.DataObject) -> None:
    s = Sessions(b"k" * 32)
    cookie = s.issue("alice", Role.READ_ONLY, 0)
    i = data.draw(st.integers(0, len(cookie) - 1))
    c = data.draw(st.characters(codec="utf-8").filter(lambda ch: ch != cookie[i]))
    changed = cookie[:i] + c + cookie[i + 1 :]
    assert s.check(changed, 1) is None
    # nor can a read-only session be turned into an admin one by re-encoding its body
    raw, _, mac = cookie.partition(".")
    import base64

    body = base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)).decode()
    forged = base64.urlsafe_b64encode(body.replace("read-only", "admin").encode()).decode()
    assert s.check(f"{forged.rstrip('=')}.{mac}", 1) is None
