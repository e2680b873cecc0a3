"""The SDK's public constructors and methods fed random arguments (wrong types, negative, zero,
huge, NaN, empty and oversized values) against a NameServer address where nothing listens. Every
call returns or raises a RaftMQError subclass; a TypeError or ValueError is accepted only when it
names the argument. Nothing else escapes (no AttributeError, struct.error, KeyError...)."""

from __future__ import annotations

import inspect
import math
import os
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raftmq import (
    Admin,
    ConsumeResult,
    Producer,
    PullConsumer,
    PushConsumer,
    QueueRef,
    RaftMQError,
    StartFrom,
)

EXAMPLES = int(os.environ.get("RAFTMQ_FUZZ_EXAMPLES", "25")) * 4
DEAD = "127.0.0.1:1"
ANY = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from([0, -1, 1, 2**31, 2**63, -(2**63), 10**30]),
    st.sampled_from([0.0, -0.5, math.nan, math.inf, 1e300]),
    st.sampled_from(["", " ", "x" * 5000, "%RETRY%g", "a;b", "127.0.0.1:99999", "名前"]),
    st.sampled_from([b"", b"\xff" * 10, [], [1, 2], {}, {"k": 5}, {1: "v"}, ("a",), object()]),
    st.sampled_from([QueueRef("t", "broker-a", 0), StartFrom.EARLIEST, ConsumeResult.SUCCESS]),
)


def _ok_error(exc: BaseException, names: list[str]) -> bool:
    if isinstance(exc, RaftMQError):
        return bool(exc.message)
    if isinstance(exc, (TypeError, ValueError)):
        text = str(exc)
        return any(n in text for n in names)
    return False


def _fuzz_call(fn: Callable[..., Any], fixed: dict[str, Any], data: st.DataObject) -> None:
    params = [
        p
        for p in inspect.signature(fn).parameters.values()
        if p.name not in ("self", *fixed) and p.kind is not p.VAR_KEYWORD
    ]
    chosen = data.draw(st.lists(st.sampled_from(params), unique=True, max_size=3)) if params else []
    kwargs = {**fixed, **{p.name: data.draw(ANY) for p in chosen}}
    try:
        result = fn(**kwargs)
    except BaseException as exc:  # the point: classify whatever escapes
        names = [p.name for p in chosen] or list(kwargs)
        assert _ok_error(exc, names), f"{fn.__qualname__}({kwargs!r}) raised {exc!r}"
    else:
        close = getattr(result, "close", None)
        if callable(close):
            close()


FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@FUZZ
@given(data=st.data())
def test_constructors(data: st.DataObject) -> None:
    which = data.draw(st.sampled_from(["producer", "pull", "push", "admin"]))
    if which == "producer":
        _fuzz_call(Producer, {"namesrv_addresses": DEAD}, data)
    elif which == "pull":
        _fuzz_call(PullConsumer, {"namesrv_addresses": DEAD, "group": "g"}, data)
    elif which == "push":
        fixed = {"namesrv_addresses": DEAD, "group": "g", "topic": "t", "listener": print}
        _fuzz_call(PushConsumer, fixed, data)
    else:
        _fuzz_call(Admin, {}, data)


@pytest.fixture(scope="module")
def clients() -> Any:
    p = Producer(DEAD, send_timeout_ms=300, request_timeout_ms=100, max_block_ms=100)
    c = PullConsumer(DEAD, "g-fuzz")
    a = Admin(DEAD)
    yield p, c, a
    p.close()
    c.close()
    a.close()


@FUZZ
@given(data=st.data())
def test_methods(clients: Any, data: st.DataObject) -> None:
    producer, consumer, admin = clients
    targets: list[tuple[Callable[..., Any], dict[str, Any]]] = [
        (producer.send, {"topic": "t", "body": b"x"}),
        (producer.send_async, {"topic": "t", "body": b"x"}),
        (producer.send_batch, {"topic": "t", "messages": [b"x"]}),
        (consumer.assign, {}),
        (consumer.seek, {}),
        (consumer.seek_to_timestamp, {}),
        (consumer.poll, {}),
        (consumer.subscribe, {}),
        (admin.create_topic, {}),
        (admin.group_lag, {}),
        (admin.message_by_id, {}),
        (admin.messages_by_key, {}),
        (admin.reset_offsets_to_time, {}),
        (admin.route, {}),
    ]
    fn, fixed = data.draw(st.sampled_from(targets))
    _fuzz_call(fn, fixed, data)
