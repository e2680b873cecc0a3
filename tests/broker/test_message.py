"""Message rules (RocketMQ's), tag hashes and message ids that parse back."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftmq.common.errors import InvalidMessageError, InvalidMessageIdError, InvalidNameError
from raftmq.common.filter.tag import tag_hash
from raftmq.common.message import (
    Message,
    MessageLimits,
    ValidNames,
    decode_msg_id,
    dlq_topic,
    encode_msg_id,
    is_system_topic,
    retry_topic,
    validate_group,
    validate_message,
    validate_messages,
    validate_topic,
)

LIMITS = MessageLimits()


def test_oversized_body_names_size_and_limit() -> None:
    with pytest.raises(InvalidMessageError) as err:
        validate_message(Message("T", b"x" * 5_000_000), LIMITS)
    assert str(err.value) == (
        "message body is 5000000 bytes; the limit is 4194304 (max_message_bytes)"
    )


def test_valid_message_passes() -> None:
    m = Message("Orders", b"{}", "TagA", ("order-1", "user 7"), {"region": "eu", "k": ""})
    validate_message(m, LIMITS)


@pytest.mark.parametrize(
    ("props", "fragment"),
    [
        ({"": "v"}, "empty or blank"),
        ({"  ": "v"}, "empty or blank"),
        ({"KEYS": "v"}, "reserved"),
        ({"UNIQ_KEY": "v"}, "reserved"),
        ({"__RMQ.TRANSIENT.X": "v"}, "reserved"),
        ({"a\nb": "v"}, "unprintable"),
        ({"n" * 256: "v"}, "max_property_name_bytes"),
        ({"ok": "line\x01"}, "control characters"),
        ({f"p{i}": "v" for i in range(129)}, "max_user_properties"),
        ({"big": "v" * 20_000}, "max_user_property_bytes"),
    ],
)
def test_property_rules(props: dict[str, str], fragment: str) -> None:
    with pytest.raises(InvalidMessageError, match=fragment):
        validate_message(Message("T", b"x", properties=props), LIMITS)


@pytest.mark.parametrize(
    ("message", "fragment"),
    [
        (Message("T", b""), "empty"),
        (Message("T", b"x", tags=" "), "blank"),
        (Message("T", b"x", tags="a|b"), "'|'"),
        (Message("T", b"x", tags="a\tb"), "control"),
        (Message("T", b"x", keys=("",)), "blank"),
        (Message("T", b"x", keys=("a\x00",)), "control"),
        (Message("T", b"x", flag=1 << 31), "32-bit"),
        (Message("T", b"x", born_host="h\n"), "born_host"),
    ],
)
def test_message_rules(message: Message, fragment: str) -> None:
    with pytest.raises(InvalidMessageError, match=fragment):
        validate_message(message, LIMITS)


def test_empty_body_allowed_when_configured() -> None:
    validate_message(Message("T", b""), MessageLimits(allow_empty_body=True))


@pytest.mark.parametrize("name", ["a", "Topic_1-x", "%|x", "t" * 127])
def test_valid_topics(name: str) -> None:
    validate_topic(name)


@pytest.mark.parametrize("name", ["", "t" * 128, "a b", "a.b", "ü", "a\n", "a/b"])
def test_invalid_topics(name: str) -> None:
    with pytest.raises(InvalidNameError):
        validate_topic(name)


def test_system_topics_only_for_the_system() -> None:
    for name in (retry_topic("g1"), dlq_topic("g1"), "TBW102", "rmq_sys_x"):
        assert is_system_topic(name)
        with pytest.raises(InvalidNameError, match="system topic"):
            validate_topic(name)
        validate_topic(name, allow_system=True)
    assert not is_system_topic("Orders")
    with pytest.raises(InvalidNameError):
        validate_message(Message(retry_topic("g"), b"x"), LIMITS)
    validate_message(Message(retry_topic("g"), b"x"), LIMITS, allow_system_topic=True)


def test_no_client_sets_the_origin_of_a_retry_or_dead_letter() -> None:
    """Only the broker's send-back stores a copy saying where it came from."""
    for topic in (retry_topic("g"), dlq_topic("g")):
        for name in ("DLQ_ORIGIN_TOPIC", "ORIGIN_MESSAGE_ID", "RETRY_TOPIC", "RECONSUME_TIME"):
            with pytest.raises(InvalidMessageError, match="reserved"):
                validate_message(
                    Message(topic, b"x", properties={name: "T"}), LIMITS, allow_system_topic=True
                )


def test_group_rules() -> None:
    validate_group("consumer_group-1")
    validate_group("g" * 255)
    for bad in ("", "g" * 256, "a b", "a.b"):
        with pytest.raises(InvalidNameError):
            validate_group(bad)


def test_tag_hash_is_stable_and_zero_for_no_tag() -> None:
    assert tag_hash(None) == 0 == tag_hash("")
    # pinned: a change would make stores and replicas of different versions disagree
    assert tag_hash("TagA") == 0x45FBF595B0C4A261
    assert tag_hash("TagA") != tag_hash("TagB")
    assert 0 < tag_hash("TagA") < 1 << 64


groups = st.text(
    alphabet=st.characters(blacklist_categories=["Cc", "Cs", "Zs", "Zl", "Zp", "Cf", "Co", "Cn"]),
    min_size=1,
    max_size=30,
)


@given(
    groups,
    st.integers(0, (1 << 64) - 1),
    st.integers(0, (1 << 32) - 1),
    st.integers(0, (1 << 32) - 1),
)
def test_msg_id_round_trip(group: str, index: int, slot: int, position: int) -> None:
    msg_id = encode_msg_id(group, index, slot, position)
    assert msg_id.isprintable()
    parsed = decode_msg_id(msg_id)
    assert (parsed.broker_group, parsed.raft_index, parsed.slot, parsed.position) == (
        group,
        index,
        slot,
        position,
    )


def test_msg_ids_sort_in_log_order() -> None:
    ids = [encode_msg_id("broker-a", i, s, p) for i, s, p in [(1, 0, 5), (1, 1, 0), (2, 0, 0)]]
    assert ids == sorted(ids)
    assert ids[0] == "broker-a-00000000000000010000000000000005"


@pytest.mark.parametrize(
    "bad",
    ["", "x", "-" + "0" * 32, "g-" + "0" * 31, "g-" + "g" * 32, "g_" + "0" * 32, "g-" + "a" * 32],
)
def test_bad_msg_ids(bad: str) -> None:
    with pytest.raises(InvalidMessageIdError):
        decode_msg_id(bad)


@given(st.none() | st.text(max_size=40))
def test_tag_hash_agrees_with_the_tag_filter(tag: str | None) -> None:
    """The ConsumeQueue stores message.tag_hash; the tag filter compares filter_tag.tag_hash."""
    filter_tag = pytest.importorskip("raftmq.common.filter.tag")
    assert filter_tag.tag_hash(tag) == tag_hash(tag)


_plain_messages = st.builds(
    Message,
    topic=st.sampled_from(["T", "", "%RETRY%g", "bad topic"]),
    body=st.sampled_from([b"", b"x", b"y" * 40]),
    tags=st.none() | st.sampled_from(["A", " ", "a|b"]),
    keys=st.sampled_from([(), ("k",), (" ",)]),
    properties=st.sampled_from([{}, {"p": "v"}]),
    flag=st.sampled_from([0, 1 << 31, -(1 << 31)]),
    born_timestamp_ms=st.sampled_from([0, 1 << 63]),
    born_host=st.sampled_from(["h:1", "h\n", "x" * 300]),
)


@given(st.lists(_plain_messages, min_size=1, max_size=6), st.booleans())
def test_a_batch_is_refused_exactly_when_one_of_its_messages_is(
    messages: list[Message], empty_ok: bool
) -> None:
    # The leader checks a batch at once (validate_messages, issue 14): what repeats is checked
    # once, so it must refuse exactly the batches in which validate_message refuses a message.
    limits = MessageLimits(max_message_bytes=32, allow_empty_body=empty_ok)
    refused_one = False
    for m in messages:
        try:
            validate_message(m, limits, allow_system_topic=True)
        except (InvalidMessageError, InvalidNameError):
            refused_one = True
    try:
        validate_messages(messages, limits, allow_system_topic=True)
        refused_all = False
    except (InvalidMessageError, InvalidNameError):
        refused_all = True
    assert refused_all == refused_one


def test_valid_names_checks_each_name_once_and_refuses_a_bad_one_every_time() -> None:
    """ValidNames (the per-batch name checks of the dispatcher, the leader and the SDK): a good
    name is checked once, a bad one raises on every call (never remembered), and the memo is
    bounded: cleared whole when full."""
    calls: list[str] = []

    def check(name: str) -> None:
        calls.append(name)
        validate_topic(name)

    names = ValidNames(check, max_names=2)
    for _ in range(3):
        names.check("Orders")
    assert calls == ["Orders"]
    for _ in range(2):
        with pytest.raises(InvalidNameError, match="may only contain"):
            names.check("bad topic")
    assert calls == ["Orders", "bad topic", "bad topic"]
    names.check("A")  # two held: full
    names.check("B")  # cleared, then B
    names.check("Orders")
    assert calls[-3:] == ["A", "B", "Orders"]
