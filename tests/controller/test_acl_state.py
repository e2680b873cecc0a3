"""The users and policies in the controller's replicated state (controller/acl_state.py): the
same commands give the same snapshot on every replica, the version counts accepted changes, a
refused command changes nothing, commands survive their encoding."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftmq.common.acl import make_user, parse_entries
from raftmq.controller.acl_state import AclCommand, AclState
from raftmq.controller.state import CommandError, ControllerState, decode

NAMES = ["alice", "bob", "carol"]
commands = st.one_of(
    st.builds(
        lambda n, s, m: AclCommand("put_user", n, make_user(n, s), m),
        st.sampled_from(NAMES),
        st.sampled_from(["secret-1", "secret-2"]),
        st.sampled_from(["upsert", "create", "update"]),
    ),
    st.builds(lambda n: AclCommand("delete_user", n), st.sampled_from(NAMES)),
    st.builds(
        lambda n, e: AclCommand("set_policy", n, entries=parse_entries(e)),
        st.sampled_from(NAMES),
        st.lists(st.sampled_from(["Topic:o*=Pub", "Group:g=Sub", "*=All"]), min_size=1),
    ),
    st.builds(lambda n: AclCommand("delete_policy", n), st.sampled_from(NAMES)),
)


def test_lifecycle_of_a_user_and_its_policy() -> None:
    s = AclState()
    alice = make_user("alice", "secret-1")
    assert (
        s.apply(AclCommand("set_policy", "alice", entries=parse_entries(["Topic:o*=Pub"])))[0]
        is False
    ), "a policy needs its user"
    assert s.apply(AclCommand("put_user", "alice", alice, "create")) == (True, "acl put_user alice")
    ok, why = s.apply(AclCommand("put_user", "alice", alice, "create"))
    assert not ok and "exists" in why
    assert s.apply(AclCommand("set_policy", "alice", entries=parse_entries(["Topic:o*=Pub"])))[0]
    assert s.version == 2 and set(s.snapshot().policies) == {"alice"}
    assert s.apply(AclCommand("delete_user", "alice"))[0]
    assert s.snapshot().policies == {} and s.snapshot().users == {}
    assert s.version == 3


@settings(max_examples=200, deadline=None)
@given(st.lists(commands, max_size=25))
def test_replicas_agree_and_versions_count_accepted_changes(cmds: list[AclCommand]) -> None:
    a, b = ControllerState(), ControllerState()
    accepted = 0
    for c in cmds:
        before = copy.deepcopy((a.acl.users, a.acl.policies))
        va = a.apply(decode(c.encode()))  # through the log's bytes, as every replica does
        vb = b.apply(c)
        assert (va.accepted, va.reason, va.epoch) == (vb.accepted, vb.reason, vb.epoch)
        if va.accepted:
            accepted += 1
        else:
            assert (a.acl.users, a.acl.policies) == before, "a refused command changed state"
        assert set(a.acl.policies) <= set(a.acl.users), "a policy outlived its user"
    assert a.acl.snapshot() == b.acl.snapshot()
    assert a.acl.version == accepted


@pytest.mark.parametrize(
    "raw",
    [
        b'{"op":"acl","kind":"drop_all","name":"a"}',
        b'{"op":"acl","kind":"put_user","name":"a"}',
        b'{"op":"acl","kind":"put_user","name":"a","user":{"name":"b","secret":"secret"}}',
        b'{"op":"acl","kind":"put_user","name":"a","user":{"name":"a","secret":"x"}}',
        b'{"op":"acl","kind":"set_policy","name":"a","entries":[{"resource":"nope"}]}',
        b'{"op":"acl","kind":"delete_user","name":"bad name!"}',
    ],
)
def test_malformed_acl_commands_are_refused_alike(raw: bytes) -> None:
    with pytest.raises(CommandError):
        decode(raw)
