"""Scenarios of the official RocketMQ 5 Python client (PyPI `rocketmq-python-client`) against a
raftmq proxy, run as a separate process: `python official_client.py SCENARIO ENDPOINT ARGS_JSON`.
Prints one JSON line (`RESULT {...}`) with what the client saw; the tests assert on it.

A separate process because the official client registers the same protobuf symbols
(apache.rocketmq.v2.*) as raftmq's generated modules, and one process cannot hold both; it is also
the black box the issue asks for: nothing of raftmq is imported here.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from rocketmq import (
    ClientConfiguration,
    ConsumeResult,
    Credentials,
    FilterExpression,
    Message,
    MessageListener,
    Producer,
    PushConsumer,
    SimpleConsumer,
    TransactionChecker,
    TransactionResolution,
)

# A secure cluster (issue 27): TLS to the proxy (trusting the CA named by gRPC's
# GRPC_DEFAULT_SSL_ROOTS_FILE_PATH) and the user's AK/SK, from the environment, for every scenario.
_TLS = os.environ.get("RMQ5_TLS") == "1"
_AK, _SK = os.environ.get("RMQ5_ACCESS_KEY", ""), os.environ.get("RMQ5_SECRET_KEY", "")


def _config(endpoint: str, ak: str = "", sk: str = "") -> ClientConfiguration:
    return ClientConfiguration(endpoint, Credentials(ak or _AK, sk or _SK), request_timeout=10)


def _view(m: Any) -> dict[str, Any]:
    return {
        "id": m.message_id,
        "body": m.body.decode(),
        "tag": m.tag,
        "keys": sorted(m.keys),
        "properties": dict(m.properties),
        "group": m.message_group,
        "attempt": m.delivery_attempt,
        "born_ms": m.born_timestamp,
        "handle": m.receipt_handle,
    }


def produce(endpoint: str, args: dict[str, Any]) -> dict[str, Any]:
    """args: topic, messages [{body, tag?, keys?, properties?, group?}]"""
    p = Producer(_config(endpoint), (args["topic"],), tls_enable=_TLS)
    p.startup()
    sent = []
    try:
        for spec in args["messages"]:
            m = Message()
            m.topic = args["topic"]
            m.body = spec["body"].encode()
            if spec.get("tag"):
                m.tag = spec["tag"]
            if spec.get("keys"):
                for key in spec["keys"]:
                    m.keys = key  # the setter adds one key per assignment
            for k, v in spec.get("properties", {}).items():
                m.add_property(k, v)
            if spec.get("group"):
                m.message_group = spec["group"]
            r = p.send(m)
            sent.append({"id": r.message_id, "offset": r.offset})
    finally:
        p.shutdown()
    return {"sent": sent}


def produce_stream(endpoint: str, args: dict[str, Any]) -> dict[str, Any]:
    """Send `count` messages one by one (`interval_s` apart), printing `SENT <id>` as each is
    acknowledged (so a test can act mid-run); a failed send is recorded and the run goes on."""
    p = Producer(_config(endpoint), (args["topic"],))
    p.startup()
    sent, failed = [], []
    try:
        for i in range(args["count"]):
            m = Message()
            m.topic = args["topic"]
            m.body = f"s{i}".encode()
            if args.get("groups"):
                m.message_group = f"g{i % args['groups']}"
            try:
                r = p.send(m)
            except Exception as exc:
                failed.append(f"{i}: {type(exc).__name__}: {exc}")
                continue
            sent.append({"id": r.message_id, "body": f"s{i}"})
            print(f"SENT {r.message_id}", flush=True)
            time.sleep(args.get("interval_s", 0.0))
    finally:
        p.shutdown()
    return {"sent": sent, "failed": failed}


def _consumer(endpoint: str, args: dict[str, Any]) -> SimpleConsumer:
    expr = FilterExpression(args.get("filter", "*"))
    c = SimpleConsumer(
        _config(endpoint),
        args["group"],
        {args["topic"]: expr},
        await_duration=args.get("await_s", 2),
        tls_enable=_TLS,
    )
    c.startup()
    return c


def consume(endpoint: str, args: dict[str, Any]) -> dict[str, Any]:
    """Receive and ack until `count` messages or `timeout_s`; then one more receive must be
    empty (`extra`: what it got)."""
    c = _consumer(endpoint, args)
    got: list[dict[str, Any]] = []
    try:
        deadline = time.time() + args.get("timeout_s", 30)
        while len(got) < args["count"] and time.time() < deadline:
            for m in c.receive(args.get("batch", 16), args.get("invisible_s", 20)):
                got.append(_view(m))
                c.ack(m)
        extra = [_view(m) for m in c.receive(16, 20)] if args.get("check_empty") else []
    finally:
        c.shutdown()
    return {"got": got, "extra": extra}


def receive_once(endpoint: str, args: dict[str, Any]) -> dict[str, Any]:
    """`rounds` single receives (batch 16), each acked: what each one returned."""
    c = _consumer(endpoint, args)
    rounds = []
    try:
        for _ in range(args.get("rounds", 1)):
            got = c.receive(16, 20)
            for m in got:
                c.ack(m)
            rounds.append([_view(m) for m in got])
    finally:
        c.shutdown()
    return {"rounds": rounds}


def _error(fn: Any) -> str:
    try:
        fn()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return ""


def redeliver(endpoint: str, args: dict[str, Any]) -> dict[str, Any]:
    """Receive one message without acking (invisible 4 s); a receive right after (long polling
    1 s) must not get it; it comes back after its invisible duration with attempt 2; the old
    handle is then refused and the new one acks."""
    c = _consumer(endpoint, args)
    out: dict[str, Any] = {}
    try:
        first: list[Any] = []
        deadline = time.time() + 20
        while not first and time.time() < deadline:
            first = c.receive(1, 4)
        out["first"] = [_view(m) for m in first]
        t0 = time.time()
        out["at_once"] = [_view(m) for m in c.receive(1, 4)]  # its long poll ends first
        again: list[Any] = []
        while not again and time.time() < t0 + 20:
            again = c.receive(1, 10)
        out["again"] = [_view(m) for m in again]
        out["again_after_s"] = time.time() - t0
        if first and again:
            out["old_ack_error"] = _error(lambda: c.ack(first[0]))
            out["new_ack_error"] = _error(lambda: c.ack(again[0]))
        out["after"] = [_view(m) for m in c.receive(1, 10)]
    finally:
        c.shutdown()
    return out


def change_invisible(endpoint: str, args: dict[str, Any]) -> dict[str, Any]:
    """Receive with 2 s invisible, extend to 30 s: it must not come back after 4 s; ack with the
    new handle."""
    c = _consumer(endpoint, args)
    out: dict[str, Any] = {}
    try:
        first: list[Any] = []
        deadline = time.time() + 20
        while not first and time.time() < deadline:
            first = c.receive(1, 2)
        out["first"] = [_view(m) for m in first]
        if first:
            c.change_invisible_duration(first[0], 30)
            out["new_handle"] = first[0].receipt_handle
            time.sleep(3)
            out["meanwhile"] = [_view(m) for m in c.receive(1, 10)]
            out["ack_error"] = _error(lambda: c.ack(first[0]))
    finally:
        c.shutdown()
    return out


def fifo(endpoint: str, args: dict[str, Any]) -> dict[str, Any]:
    """Receive everything of an ordered topic, acking each batch in order, and record the order.
    `probe_block`: after the first batch, receive again before acking it: a FIFO queue with
    unacknowledged messages must give nothing (every message in one group: one queue)."""
    c = _consumer(endpoint, args)
    got: list[dict[str, Any]] = []
    probe: list[dict[str, Any]] = []
    try:
        deadline = time.time() + args.get("timeout_s", 40)
        while len(got) < args["count"] and time.time() < deadline:
            batch = c.receive(args.get("batch", 4), 20)
            if batch and args.get("probe_block") and not got:
                probe = [_view(m) for m in c.receive(32, 20)]
            for m in batch:
                got.append(_view(m))
                c.ack(m)
    finally:
        c.shutdown()
    return {"got": got, "probe": probe}


def push(endpoint: str, args: dict[str, Any]) -> dict[str, Any]:
    """A PushConsumer (QueryAssignment, then receives by the client itself) until `count`."""
    got: list[dict[str, Any]] = []

    class Listener(MessageListener):  # type: ignore[misc]
        def consume(self, message: Any) -> Any:
            got.append(_view(message))
            return ConsumeResult.SUCCESS

    c = PushConsumer(
        _config(endpoint), args["group"], Listener(), {args["topic"]: FilterExpression("*")}
    )
    c.startup()
    try:
        deadline = time.time() + args.get("timeout_s", 30)
        while len(got) < args["count"] and time.time() < deadline:
            time.sleep(0.2)
    finally:
        c.shutdown()
    return {"got": got}


def bench(endpoint: str, args: dict[str, Any]) -> dict[str, Any]:
    """Send `count` messages of `size` bytes with up to `inflight` send_async in flight, then
    receive and ack them all with a SimpleConsumer; the rates (bench/rmq5_bench.py)."""
    topic, count, body = args["topic"], args["count"], b"x" * args.get("size", 1024)
    p = Producer(_config(endpoint), (topic,))
    p.startup()
    window: list[Any] = []
    t0 = time.perf_counter()
    for _ in range(count):
        m = Message()
        m.topic = topic
        m.body = body
        window.append(p.send_async(m))
        if len(window) >= args.get("inflight", 64):
            window.pop(0).result(30)
    for f in window:
        f.result(30)
    send_s = time.perf_counter() - t0
    p.shutdown()
    c = _consumer(endpoint, {"topic": topic, "group": args["group"], "await_s": 2})
    got = 0
    t0 = time.perf_counter()
    deadline = time.time() + 120
    try:
        while got < count and time.time() < deadline:
            for m in c.receive(32, 60):
                c.ack(m)
                got += 1
        receive_s = time.perf_counter() - t0
    finally:
        c.shutdown()
    return {"sent": count, "send_s": send_s, "received": got, "receive_s": receive_s}


def delayed(endpoint: str, args: dict[str, Any]) -> dict[str, Any]:
    """Send one message due `delay_s` whole seconds from now (the client's delivery_timestamp
    is in seconds), then receive with a SimpleConsumer until it arrives: when it was sent, due
    and received (ms since the epoch)."""
    p = Producer(_config(endpoint), (args["topic"],))
    p.startup()
    try:
        m = Message()
        m.topic = args["topic"]
        m.body = args["body"].encode()
        due_s = int(time.time()) + args["delay_s"]
        m.delivery_timestamp = due_s
        due_ms = due_s * 1000
        sent_ms = int(time.time() * 1000)
        r = p.send(m)
    finally:
        p.shutdown()
    c = _consumer(endpoint, args)
    got: list[dict[str, Any]] = []
    early: list[dict[str, Any]] = []
    received_ms = 0
    try:
        deadline = time.time() + args.get("timeout_s", 40)
        while not got and time.time() < deadline:
            for msg in c.receive(16, 20):
                view = _view(msg)
                if int(time.time() * 1000) < due_ms - 50:
                    early.append(view)
                got.append(view)
                received_ms = int(time.time() * 1000)
                c.ack(msg)
    finally:
        c.shutdown()
    return {
        "id": r.message_id,
        "sent_ms": sent_ms,
        "due_ms": due_ms,
        "received_ms": received_ms,
        "got": got,
        "early": early,
    }


def transactions(endpoint: str, args: dict[str, Any]) -> dict[str, Any]:
    """Three transactions on `topic`: "commit" committed, "rollback" rolled back, "orphan" left
    open; the checker answers the proxy's check-back of the orphan with COMMIT. The producer
    stays up until the checker was asked (or `check_wait_s`)."""
    checked: list[dict[str, Any]] = []

    class Checker(TransactionChecker):  # type: ignore[misc]
        def check(self, message: Any) -> Any:
            checked.append({"id": message.message_id, "body": message.body.decode()})
            return TransactionResolution.COMMIT

    p = Producer(_config(endpoint), (args["topic"],), Checker())
    p.startup()
    out: dict[str, Any] = {"sent": {}}
    try:
        for body in ("commit", "rollback", "orphan"):
            t = p.begin_transaction()
            m = Message()
            m.topic = args["topic"]
            m.body = body.encode()
            r = p.send(m, t)
            out["sent"][body] = {"id": r.message_id, "txn": r.transaction_id}
            if body == "commit":
                t.commit()
            elif body == "rollback":
                t.rollback()
        deadline = time.time() + args.get("check_wait_s", 40)
        while not checked and time.time() < deadline:
            time.sleep(0.2)
        time.sleep(1)  # the checker's EndTransaction goes out on the client's threads
    finally:
        p.shutdown()
    out["checked"] = checked
    return out


def unacked(endpoint: str, args: dict[str, Any]) -> dict[str, Any]:
    """Receive without ever acking (invisible 1 s) for `watch_s`: every delivery's attempt."""
    c = _consumer(endpoint, args)
    got: list[dict[str, Any]] = []
    try:
        deadline = time.time() + args.get("watch_s", 10)
        while time.time() < deadline:
            got.extend(_view(m) for m in c.receive(16, 1))
    finally:
        c.shutdown()
    return {"got": got}


def push_failing(endpoint: str, args: dict[str, Any]) -> dict[str, Any]:
    """A PushConsumer whose listener always fails, until it saw `attempts` deliveries and then
    `linger_s`. On an ordered topic the client retries locally and past its max attempts
    forwards the message to the dead-letter queue (ForwardMessageToDeadLetterQueue); otherwise
    it nacks (changes the invisible duration) and the proxy counts the deliveries."""
    seen: list[dict[str, Any]] = []

    class Listener(MessageListener):  # type: ignore[misc]
        def consume(self, message: Any) -> Any:
            seen.append(_view(message))
            return ConsumeResult.FAILURE

    c = PushConsumer(
        _config(endpoint), args["group"], Listener(), {args["topic"]: FilterExpression("*")}
    )
    c.startup()
    try:
        deadline = time.time() + args.get("watch_s", 20)
        while len(seen) < args["attempts"] and time.time() < deadline:
            time.sleep(0.1)
        time.sleep(args.get("linger_s", 2))  # the forward goes out after the last attempt
    finally:
        c.shutdown()
    return {"seen": seen}


def steps(endpoint: str, args: dict[str, Any]) -> dict[str, Any]:
    """Several scenarios in one process (one interpreter start): {"steps": [[name, args], ...]}
    -> {"results": [...]}."""
    return {"results": [SCENARIOS[name](endpoint, a) for name, a in args["steps"]]}


def secured(endpoint: str, args: dict[str, Any]) -> dict[str, Any]:
    """Issue 19. args: ak, sk, topic, denied_topic, group, denied_group. Sends to `topic` and
    `denied_topic`, receives as `group` and `denied_group`, each with the credentials (and one
    send without any): what each did or the error it raised."""
    ak, sk = args["ak"], args["sk"]
    out: dict[str, Any] = {}
    p = Producer(_config(endpoint, ak, sk), (args["topic"],))
    p.startup()
    try:
        m = Message()
        m.topic, m.body = args["topic"], b"signed"
        out["sent"] = p.send(m).message_id
        m = Message()
        m.topic, m.body = args["denied_topic"], b"denied"
        out["denied_send"] = _error(lambda: p.send(m))
    finally:
        p.shutdown()

    def receive(group: str, creds: tuple[str, str]) -> Any:
        c = SimpleConsumer(
            _config(endpoint, *creds), group, {args["topic"]: FilterExpression("*")},
            await_duration=2,
        )  # fmt: skip
        try:
            c.startup()
            got = c.receive(16, 20)
            for x in got:
                c.ack(x)
            return len(got)
        finally:
            c.shutdown()

    out["received"] = receive(args["group"], (ak, sk))
    out["denied_receive"] = _error(lambda: receive(args["denied_group"], (ak, sk)))

    def send_as(ak: str, sk: str) -> None:
        q = Producer(_config(endpoint, ak, sk), (args["topic"],))
        q.startup()
        try:
            m = Message()
            m.topic, m.body = args["topic"], b"anonymous"
            q.send(m)
        finally:
            q.shutdown()

    out["anonymous_send"] = _error(lambda: send_as("", ""))
    out["bad_secret_send"] = _error(lambda: send_as(ak, "not-the-secret"))
    return out


SCENARIOS = {
    "secured": secured,
    "steps": steps,
    "delayed": delayed,
    "transactions": transactions,
    "unacked": unacked,
    "push_failing": push_failing,
    "bench": bench,
    "produce_stream": produce_stream,
    "push": push,
    "produce": produce,
    "consume": consume,
    "redeliver": redeliver,
    "change_invisible": change_invisible,
    "fifo": fifo,
    "receive_once": receive_once,
}

if __name__ == "__main__":
    name, endpoint, raw = sys.argv[1], sys.argv[2], sys.argv[3]
    result = SCENARIOS[name](endpoint, json.loads(raw))
    print("RESULT " + json.dumps(result), flush=True)
