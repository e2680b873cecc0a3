"""The access decision (common/acl.py) as a pure function: super users may do anything, a
matching Deny wins over any Allow, no matching entry is a Deny; patterns match literally, by
prefix or anything of a type; the RPC table covers every method of every served service."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
    authorize,
    group,
    parse_entries,
    topic,
    why_denied,
    with_entries,
)
from raftmq.common.errors import InvalidArgumentError
from raftmq.common.pb import broker_pb2, controller_pb2, namesrv_pb2, transaction_pb2
from raftmq.common.pb.apache.rocketmq.v2 import service_pb2
from raftmq.common.rpc_acl import RULES, SUPER

ALICE = User("alice", "alice-secret")
ROOT = User("root", "root-secret", UserType.SUPER)


def acl_of(*entries: PolicyEntry, users: tuple[User, ...] = (ALICE, ROOT)) -> Acl:
    return Acl(1, {u.name: u for u in users}, {"alice": tuple(entries)})


def test_prefix_literal_and_any_patterns() -> None:
    acl = acl_of(*parse_entries(["Topic:orders*=Pub", "Group:billing=Sub"]))
    assert authorize(acl, "alice", Action.PUB, topic("orders-eu")) is Decision.ALLOW
    assert authorize(acl, "alice", Action.PUB, topic("orders")) is Decision.ALLOW
    assert authorize(acl, "alice", Action.PUB, topic("payments")) is Decision.DENY
    assert authorize(acl, "alice", Action.SUB, topic("orders-eu")) is Decision.DENY
    assert authorize(acl, "alice", Action.SUB, group("billing")) is Decision.ALLOW
    assert authorize(acl, "alice", Action.SUB, group("billing2")) is Decision.DENY, "literal"
    assert authorize(acl, "alice", Action.PUB, group("orders-x")) is Decision.DENY, "type"
    assert authorize(acl, "nobody", Action.PUB, topic("orders")) is Decision.DENY
    assert authorize(acl, "root", Action.DELETE, topic("anything")) is Decision.ALLOW
    anything = acl_of(*parse_entries(["*=All"]))
    assert authorize(anything, "alice", Action.CREATE, group("g")) is Decision.ALLOW


def test_deny_wins_and_retry_topics_are_the_groups() -> None:
    entries = parse_entries(["Topic:*=Pub,Sub"]) + parse_entries(
        ["Topic:orders-secret=Pub"], "Deny"
    )
    acl = acl_of(*entries)
    assert authorize(acl, "alice", Action.PUB, topic("orders-eu")) is Decision.ALLOW
    assert authorize(acl, "alice", Action.PUB, topic("orders-secret")) is Decision.DENY
    assert authorize(acl, "alice", Action.SUB, topic("orders-secret")) is Decision.ALLOW
    assert topic("%RETRY%billing") == Resource(ResourceType.GROUP, "billing")
    assert topic("%DLQ%billing") == Resource(ResourceType.GROUP, "billing")


def test_admin_from_the_description_is_super_without_being_replicated() -> None:
    acl = Acl()
    admin = User("ops", "ops-secret", UserType.SUPER)
    assert authorize(acl, "ops", Action.DELETE, topic("t"), admin) is Decision.ALLOW
    assert authorize(acl, "ops", Action.DELETE, topic("t")) is Decision.DENY


@pytest.mark.parametrize(
    "bad", ["orders", "Topic:", "Topic:or*ders", "Queue:x", "Topic:" + "x" * 200, ""]
)
def test_bad_patterns_are_typed_errors(bad: str) -> None:
    with pytest.raises(InvalidArgumentError):
        ResourcePattern.parse(bad)


def test_bad_entries_are_typed_errors() -> None:
    for bad in (["Topic:a"], ["Topic:a=Fly"], ["Topic:a="]):
        with pytest.raises(InvalidArgumentError):
            parse_entries(bad)


def test_snapshot_round_trips() -> None:
    acl = acl_of(*parse_entries(["Topic:orders*=Pub", "Group:g=Sub"]))
    back = Acl.from_json(acl.to_json())
    assert back == Acl(1, dict(acl.users), dict(acl.policies))
    with pytest.raises(InvalidArgumentError):
        Acl.from_json(b"{}")


# ---- the property: the decision against a plain model ----------------------------------------

NAMES = ["orders", "orders-eu", "ord", "payments", "billing", "b"]
patterns = st.one_of(
    st.just("*"),
    st.builds(
        lambda t, n, p: f"{t}:{n}{'*' if p else ''}",
        st.sampled_from(["Topic", "Group"]),
        st.sampled_from(["", *NAMES]).filter(bool) | st.just(""),
        st.booleans(),
    ).filter(lambda s: not s.endswith(":")),
)
entries = st.builds(
    lambda r, acts, d: PolicyEntry.from_dict({"resource": r, "actions": acts, "decision": d}),
    patterns,
    st.lists(st.sampled_from([a.value for a in Action]), min_size=1, max_size=3),
    st.sampled_from(["Allow", "Deny"]),
)
resources = st.builds(
    Resource, st.sampled_from([ResourceType.TOPIC, ResourceType.GROUP]), st.sampled_from(NAMES)
)
actions = st.sampled_from([a for a in Action if a is not Action.ALL])


def model(es: list[PolicyEntry], action: Action, r: Resource) -> Decision:
    def matches(e: PolicyEntry) -> bool:
        text = str(e.resource)
        if text == "*":
            ok = True
        else:
            kind, name = text.split(":", 1)
            ok = kind == r.type.value and (
                r.name.startswith(name[:-1]) if name.endswith("*") else r.name == name
            )
        return ok and (action in e.actions or Action.ALL in e.actions)

    hits = [e for e in es if matches(e)]
    if any(e.decision is Decision.DENY for e in hits):
        return Decision.DENY
    return Decision.ALLOW if hits else Decision.DENY


@settings(max_examples=400, deadline=None)
@given(st.lists(entries, max_size=6), actions, resources)
def test_decision_matches_the_model(es: list[PolicyEntry], action: Action, r: Resource) -> None:
    acl = acl_of(*es)
    assert authorize(acl, "alice", action, r) is model(es, action, r)
    assert authorize(acl, "root", action, r) is Decision.ALLOW
    assert authorize(acl, "mallory", action, r) is Decision.DENY


@settings(max_examples=200, deadline=None)
@given(st.lists(entries, max_size=6), actions, resources)
def test_a_matching_deny_always_wins(es: list[PolicyEntry], action: Action, r: Resource) -> None:
    deny = PolicyEntry(ResourcePattern(r.type, r.name, False), frozenset({action}), Decision.DENY)
    for at in range(len(es) + 1):
        assert authorize(acl_of(*es[:at], deny, *es[at:]), "alice", action, r) is Decision.DENY


@settings(max_examples=300, deadline=None)
@given(st.lists(entries, max_size=6), actions, resources)
def test_a_denial_says_why_and_its_grant_allows_it(
    es: list[PolicyEntry], action: Action, r: Resource
) -> None:
    """Issue 27: a Deny is explained by the Deny entry that matched, or by the want of an Allow;
    the grant the message names (add the entry, or remove that Deny) makes it an Allow, and
    leaves every other entry as it was."""
    acl = acl_of(*es)
    if authorize(acl, "alice", action, r) is Decision.ALLOW:
        return
    refusal = why_denied(acl, "alice", [action], r)
    assert refusal.user_known
    if refusal.deny is not None:
        assert refusal.deny in es and refusal.deny.covers(action, r)
        granted = with_entries(es, remove=[e for e in es if e == refusal.deny])
        if any(e.decision is Decision.DENY and e.covers(action, r) for e in granted):
            return  # another Deny also matches: the next denial names it
        if not refusal.allowed_otherwise:  # the grant adds the Allow as well
            [entry] = parse_entries([f"{r.type.value}:{r.name}={action.value}"])
            granted = with_entries(granted, add=[entry])
    else:
        assert not any(e.covers(action, r) for e in es)
        [entry] = parse_entries([f"{r.type.value}:{r.name}={action.value}"])
        granted = with_entries(es, add=[entry])
        assert granted[: len(es)] == tuple(es)  # additive: nothing else moved
    assert authorize(acl_of(*granted), "alice", action, r) is Decision.ALLOW
    assert not why_denied(acl, "mallory", [action], r).user_known


# ---- the RPC table ------------------------------------------------------------------------------


def test_every_rpc_of_every_role_has_a_rule() -> None:
    services = [
        *broker_pb2.DESCRIPTOR.services_by_name.values(),
        *transaction_pb2.DESCRIPTOR.services_by_name.values(),
        *namesrv_pb2.DESCRIPTOR.services_by_name.values(),
        *controller_pb2.DESCRIPTOR.services_by_name.values(),
        service_pb2.DESCRIPTOR.services_by_name["MessagingService"],
    ]
    paths = {f"/{s.full_name}/{m.name}" for s in services for m in s.methods}
    assert len(paths) > 50
    missing = paths - set(RULES)
    assert not missing, f"methods without an access rule: {sorted(missing)}"


def test_rules_name_the_resources_of_the_request() -> None:
    send = broker_pb2.SendMessageRequest(topic="orders-eu")
    assert list(RULES["/raftmq.v1.Broker/SendMessage"](send)) == [(Action.PUB, topic("orders-eu"))]
    pull = broker_pb2.PullMessageRequest(topic="t", consumer_group="g")
    assert set(RULES["/raftmq.v1.Broker/PullMessage"](pull)) == {
        (Action.SUB, topic("t")),
        (Action.SUB, group("g")),
    }
    commit = broker_pb2.CommitOffsetRequest(consumer_group="g")
    commit.offsets.add().topic = "t"
    assert set(RULES["/raftmq.v1.Broker/CommitOffset"](commit)) == {
        (Action.SUB, topic("t")),
        (Action.SUB, group("g")),
    }
    assert tuple(RULES["/raftmq.v1.NameServer/RegisterBroker"](None)) == SUPER
    assert tuple(RULES["/raftmq.v1.Controller/PutUser"](None)) == SUPER


def test_every_rule_reads_only_fields_its_request_has() -> None:
    """A rule that names a field its request lacks would fail every call of the method."""
    from google.protobuf.message_factory import GetMessageClass

    services = [
        *broker_pb2.DESCRIPTOR.services_by_name.values(),
        *transaction_pb2.DESCRIPTOR.services_by_name.values(),
        *namesrv_pb2.DESCRIPTOR.services_by_name.values(),
        *controller_pb2.DESCRIPTOR.services_by_name.values(),
        service_pb2.DESCRIPTOR.services_by_name["MessagingService"],
    ]
    for s in services:
        for m in s.methods:
            req = GetMessageClass(m.input_type)()
            for f in m.input_type.fields:  # one item in every repeated message field
                value = getattr(req, f.name)
                if f.message_type is not None and hasattr(value, "add"):
                    value.add()
            list(RULES[f"/{s.full_name}/{m.name}"](req))
    batches = broker_pb2.SendBatchesRequest()
    batches.batches.add().topic = "a"
    assert list(RULES["/raftmq.v1.Broker/SendBatches"](batches)) == [(Action.PUB, topic("a"))]


def test_every_framed_method_has_a_rule_and_pop_is_consuming() -> None:
    """The framed data path refuses a method without a rule: every DataMethod needs one (the
    replicated POP state's methods came after the ACL table was written)."""
    from raftmq.common.data_api import PAYLOADS, DataMethod
    from raftmq.common.pb import pop_pb2
    from raftmq.common.rpc_acl import FRAME_RULES

    assert set(PAYLOADS) <= {DataMethod(m) for m in FRAME_RULES}
    want = {(Action.SUB, topic("orders")), (Action.SUB, group("billing"))}
    for method, req in (
        (DataMethod.POP_STATE, pop_pb2.PopStateRequest(topic="orders", consumer_group="billing")),
        (
            DataMethod.POP_RECEIVE,
            pop_pb2.PopReceiveRequest(topic="orders", consumer_group="billing"),
        ),
        (DataMethod.POP_ACK, pop_pb2.PopAckRequest(topic="orders", consumer_group="billing")),
    ):
        assert set(FRAME_RULES[int(method)](req)) == want, method
