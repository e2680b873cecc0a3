"""Signed requests (common/auth.py, common/auth_guard.py) without a network: the official
client's form, the replay window, bad signatures, credentials sources, the guard's cached
decisions dropped on a new ACL version."""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

import pytest

from raftmq.common.acl import (
    Acl,
    Action,
    Decision,
    PolicyEntry,
    Resource,
    ResourcePattern,
    ResourceType,
    User,
    UserType,
    parse_entries,
)
from raftmq.common.auth import (
    AUTH_HMAC_SHA1,
    Credentials,
    Signer,
    date_time,
    load_credentials,
    parse_authorization,
    parse_hello_auth,
    verify,
)
from raftmq.common.auth_guard import AuthConfig, Guard
from raftmq.common.errors import AccessDeniedError, InvalidArgumentError, UnauthenticatedError
from raftmq.common.pb import broker_pb2

NOW_MS = 1_764_000_000_000  # 2025-11-24T16:00:00Z
ALICE = User("alice", "alice-secret")
ADMIN = User("admin", "admin-secret", UserType.SUPER)


def test_the_official_clients_form() -> None:
    # rocketmq-python-client 5.1.2, rocketmq/v5/util/signature.py, reproduced byte for byte
    when = date_time(NOW_MS)
    assert when == "20251124T160000Z"
    md = dict(Signer(Credentials("alice", "alice-secret"), lambda: NOW_MS).metadata())
    sig = hmac.new(b"alice-secret", when.encode(), hashlib.sha1).hexdigest()
    assert md["x-mq-date-time"] == when
    assert md["authorization"] == (
        f"MQv2-HMAC-SHA1 Credential=alice, SignedHeaders=x-mq-date-time, Signature={sig}"
    )
    req = parse_authorization(md["authorization"], when)
    acl = Acl(1, {"alice": ALICE})
    assert verify(req, acl, ADMIN, NOW_MS) == "alice"
    # rocketmq-client-nodejs (and the Java client) sign in upper-case hex (issue 27)
    node = f"MQv2-HMAC-SHA1 Credential=alice, SignedHeaders=x-mq-date-time, Signature={sig.upper()}"
    assert verify(parse_authorization(node, when), acl, ADMIN, NOW_MS) == "alice"
    odd = parse_authorization(node.replace(sig.upper(), "é" * 40), when)
    with pytest.raises(UnauthenticatedError, match="does not match"):
        verify(odd, acl, ADMIN, NOW_MS)  # not a TypeError from compare_digest


def test_bad_signatures_unknown_keys_and_replays_are_refused() -> None:
    acl = Acl(1, {"alice": ALICE})
    good = dict(Signer(Credentials("alice", "alice-secret"), lambda: NOW_MS).metadata())
    req = parse_authorization(good["authorization"], good["x-mq-date-time"])
    wrong = dict(Signer(Credentials("alice", "not-her-secret"), lambda: NOW_MS).metadata())
    with pytest.raises(UnauthenticatedError, match="signature does not match"):
        verify(
            parse_authorization(wrong["authorization"], wrong["x-mq-date-time"]), acl, None, NOW_MS
        )
    ghost = dict(Signer(Credentials("ghost", "ghost-secret"), lambda: NOW_MS).metadata())
    with pytest.raises(UnauthenticatedError, match="unknown"):
        verify(
            parse_authorization(ghost["authorization"], ghost["x-mq-date-time"]), acl, None, NOW_MS
        )
    # the same signature 15 min + 1 s later (or earlier): a replay
    for skew in (15 * 60_000 + 1000, -(15 * 60_000 + 1000)):
        with pytest.raises(UnauthenticatedError, match="replay"):
            verify(req, acl, None, NOW_MS + skew)
    assert verify(req, acl, None, NOW_MS + 14 * 60_000) == "alice"
    with pytest.raises(UnauthenticatedError, match="replay"):
        verify(req, acl, None, NOW_MS + 61_000, window_ms=60_000)
    for bad in ("", "Basic abc", "MQv2-HMAC-SHA1 Credential=alice", "x" * 5000):
        with pytest.raises(UnauthenticatedError):
            parse_authorization(bad, good["x-mq-date-time"])
    with pytest.raises(UnauthenticatedError, match="yyyyMMdd"):
        verify(parse_authorization(good["authorization"], "yesterday"), acl, None, NOW_MS)


def test_hello_auth_round_trips_and_garbage_is_refused() -> None:
    method, auth = Signer(Credentials("alice", "alice-secret"), lambda: NOW_MS).hello_auth()
    assert method == AUTH_HMAC_SHA1
    req = parse_hello_auth(method, auth)
    assert verify(req, Acl(1, {"alice": ALICE}), None, NOW_MS) == "alice"
    for m, a in ((0, b""), (7, auth), (1, b"\xff\xfe"), (1, b"alice\nonly")):
        with pytest.raises(UnauthenticatedError):
            parse_hello_auth(m, a)


def test_credentials_sources(tmp_path: Path) -> None:
    assert load_credentials("a", "b", env={}) == Credentials("a", "b")
    env = {"RAFTMQ_ACCESS_KEY": "ea", "RAFTMQ_SECRET_KEY": "es"}
    assert load_credentials(env=env) == Credentials("ea", "es")
    f = tmp_path / "creds.toml"
    f.write_text('access_key = "fa"\nsecret_key = "fs"\n')
    assert load_credentials(path=f, env={}) == Credentials("fa", "fs")
    assert load_credentials(env={"RAFTMQ_CREDENTIALS_FILE": str(f)}) == Credentials("fa", "fs")
    with pytest.raises(InvalidArgumentError, match="does not exist"):
        load_credentials(path=tmp_path / "missing.toml", env={})
    with pytest.raises(InvalidArgumentError):
        load_credentials("only-the-key", None, env={})
    assert "fs" not in repr(Credentials("fa", "fs"))


def test_guard_caches_decisions_until_the_acl_changes() -> None:
    state = {"acl": Acl(1, {"alice": ALICE}, {"alice": parse_entries(["Topic:orders*=Pub"])})}
    now = [NOW_MS]
    guard = Guard(AuthConfig(True, ADMIN, 900_000), lambda: state["acl"], lambda: now[0])
    md = Signer(Credentials("alice", "alice-secret"), lambda: now[0]).metadata()
    who = guard.authenticate_metadata(md)
    assert who == "alice"
    send = broker_pb2.SendMessageRequest(topic="orders-eu")
    guard.check_path(who, "/raftmq.v1.Broker/SendMessage", send)
    with pytest.raises(AccessDeniedError) as denied:
        guard.check_path(
            who, "/raftmq.v1.Broker/SendMessage", broker_pb2.SendMessageRequest(topic="payments")
        )
    assert denied.value.details == {
        "subject": "alice",
        "action": "Pub",
        "resource": "Topic:payments",
        "reason": "no_allow",
        "grant": "raftmq acl policy add alice Topic:payments=Pub",
    }
    assert denied.value.code == "ACCESS_DENIED"
    with pytest.raises(AccessDeniedError, match="super users"):
        guard.check_path(who, "/raftmq.v1.NameServer/RegisterBroker", None)
    with pytest.raises(AccessDeniedError, match="no access rule"):
        guard.check_path(who, "/raftmq.v1.Broker/NoSuchMethod", None)
    # a new version without the policy: the cached Allow is gone at once
    state["acl"] = Acl(2, {"alice": ALICE}, {})
    with pytest.raises(AccessDeniedError):
        guard.check_path(who, "/raftmq.v1.Broker/SendMessage", send)
    # the user deleted: its cached signature is gone too
    state["acl"] = Acl(3, {}, {})
    with pytest.raises(UnauthenticatedError):
        guard.authenticate_metadata(md)
    # the admin from the description works with an empty ACL; a cached signature still ages
    admin_md = Signer(Credentials("admin", "admin-secret"), lambda: now[0]).metadata()
    assert guard.authenticate_metadata(admin_md) == "admin"
    guard.check_path("admin", "/raftmq.v1.NameServer/RegisterBroker", None)
    now[0] += 16 * 60_000
    with pytest.raises(UnauthenticatedError, match="replay"):
        guard.authenticate_metadata(admin_md)
    with pytest.raises(UnauthenticatedError, match="requires signed requests"):
        guard.authenticate_metadata(())


def test_no_decision_of_an_older_acl_outlives_a_newer_one() -> None:
    """A decision computed from one ACL version while another request moves the guard to a
    newer version must not be cached under the newer one. Made deterministic: the pattern's
    match (inside the first check) installs the new version and runs a request on it."""
    deny = Acl(2, {"alice": ALICE}, {"alice": parse_entries(["Topic:other=Pub"])})
    state: dict[str, Acl] = {}
    guard = Guard(AuthConfig(True, ADMIN, 900_000), lambda: state["acl"])

    class Meanwhile(ResourcePattern):
        def matches(self, r: Resource) -> bool:
            if state["acl"] is not deny:  # another thread's request, on the new version
                state["acl"] = deny
                with pytest.raises(AccessDeniedError):
                    guard.check_topic("alice", Action.PUB, "other-topic")
            return super().matches(r)

    entry = PolicyEntry(
        Meanwhile(ResourceType.TOPIC, "orders", True), frozenset({Action.PUB}), Decision.ALLOW
    )
    state["acl"] = Acl(1, {"alice": ALICE}, {"alice": (entry,)})
    guard.check_topic("alice", Action.PUB, "orders-eu")  # allowed by version 1
    with pytest.raises(AccessDeniedError):  # version 2 has no such Allow
        guard.check_topic("alice", Action.PUB, "orders-eu")


def test_auth_settings_without_keys_or_controllers_are_one_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from raftmq.broker import settings as broker_settings
    from raftmq.common.settings import SettingsError
    from raftmq.proxy import settings as proxy_settings

    monkeypatch.delenv("RAFTMQ_ADMIN_ACCESS_KEY", raising=False)
    monkeypatch.delenv("RAFTMQ_ADMIN_SECRET_KEY", raising=False)
    with pytest.raises(SettingsError, match="admin's keys"):
        broker_settings.load(None, {"auth_enabled": True}, environ={})
    keys = {"auth_enabled": True, "auth_admin_access_key": "a", "auth_admin_secret_key": "b" * 6}
    with pytest.raises(SettingsError, match="controllers' addresses"):
        proxy_settings.load(None, keys, environ={})
    monkeypatch.setenv("RAFTMQ_ADMIN_ACCESS_KEY", "a")
    monkeypatch.setenv("RAFTMQ_ADMIN_SECRET_KEY", "secret")
    ok = broker_settings.load(
        None, {"auth_enabled": True, "controller_addresses": "127.0.0.1:9881"}, environ={}
    )
    assert ok.auth_enabled and ok.auth_admin_secret_key == ""  # the env holds the secret
