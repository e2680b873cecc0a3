"""Offset and position JSON of the raftmq Spark source: topic -> broker group -> queue id -> value.

Pure: parses what users and Spark's checkpoint hand us and writes it back in one fixed order
(topics, then groups sorted by name, queue ids sorted numerically), because Spark compares offsets
as strings. Never does I/O; never accepts a malformed document silently.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from raftmq.common.types import QueueRef

# Sentinels inside startingOffsets / endingOffsets JSON, as in Spark's Kafka source.
EARLIEST = -2
LATEST = -1
MAX_QUEUE_ID = 2**31 - 1
MAX_OFFSET = 2**63 - 1

OffsetJson = dict[str, dict[str, dict[str, int]]]


class OffsetsFormatError(ValueError):
    """A JSON offsets/positions document is malformed; the message names the option and the spot."""


def to_json_dict(values: Mapping[QueueRef, int]) -> OffsetJson:
    """Nested dicts built in the canonical order (json.dumps keeps insertion order)."""
    out: OffsetJson = {}
    for q in sorted(values):
        out.setdefault(q.topic, {}).setdefault(q.broker_group, {})[str(q.queue_id)] = int(values[q])
    return out


def serialize(values: Mapping[QueueRef, int]) -> str:
    """The canonical JSON text: equal offsets always give equal strings."""
    return json.dumps(to_json_dict(values), separators=(",", ":"))


def from_json_dict(
    doc: object,
    *,
    what: str = "offsets",
    check_value: Callable[[QueueRef, int], str | None] | None = None,
) -> dict[QueueRef, int]:
    """Parse topic -> group -> queue -> int. `check_value` returns a complaint or None."""
    if not isinstance(doc, dict):
        raise OffsetsFormatError(
            f"{what} must be a JSON object of topic -> broker group -> queue id -> number, "
            f'e.g. {{"orders": {{"broker-a": {{"0": 42}}}}}}; got {type(doc).__name__}'
        )
    out: dict[QueueRef, int] = {}
    for topic, groups in doc.items():
        if not isinstance(topic, str) or not topic:
            raise OffsetsFormatError(f"{what}: topic names must be non-empty strings")
        if not isinstance(groups, dict):
            raise OffsetsFormatError(
                f"{what}: topic {topic!r} must map broker group names to objects, "
                f"got {type(groups).__name__}"
            )
        for group, queues in groups.items():
            if not isinstance(group, str) or not group:
                raise OffsetsFormatError(f"{what}: topic {topic!r} has an empty broker group name")
            if not isinstance(queues, dict):
                raise OffsetsFormatError(
                    f"{what}: {topic}/{group} must map queue ids to numbers, "
                    f"got {type(queues).__name__}"
                )
            for qid_text, value in queues.items():
                qid = _queue_id(qid_text, what, topic, group)
                if isinstance(value, bool) or not isinstance(value, int):
                    raise OffsetsFormatError(
                        f"{what}: {topic}/{group}/{qid_text} must be an integer, got {value!r}"
                    )
                if not -(2**63) <= value <= MAX_OFFSET:
                    raise OffsetsFormatError(f"{what}: {topic}/{group}/{qid_text} is out of range")
                ref = QueueRef(topic, group, qid)
                if check_value is not None:
                    complaint = check_value(ref, value)
                    if complaint:
                        raise OffsetsFormatError(f"{what}: {topic}/{group}/{qid_text}: {complaint}")
                out[ref] = value
    return out


def parse(
    text: str,
    *,
    what: str = "offsets",
    check_value: Callable[[QueueRef, int], str | None] | None = None,
) -> dict[QueueRef, int]:
    """Parse JSON text (a user option or a checkpointed offset)."""
    try:
        doc: Any = json.loads(text)
    except json.JSONDecodeError as exc:
        raise OffsetsFormatError(
            f"{what} is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}): "
            f"{_clip(text)}"
        ) from None
    return from_json_dict(doc, what=what, check_value=check_value)


def parse_assignment(text: str) -> tuple[QueueRef, ...]:
    """The `assign` option: {"topic": {"broker-a": [0, 1]}} -> sorted queues."""
    try:
        doc: Any = json.loads(text)
    except json.JSONDecodeError as exc:
        raise OffsetsFormatError(
            f"assign is not valid JSON ({exc.msg}); expected "
            f'{{"topic": {{"broker-a": [0, 1]}}}}: {_clip(text)}'
        ) from None
    if not isinstance(doc, dict) or not doc:
        raise OffsetsFormatError(
            'assign must be a non-empty JSON object, e.g. {"orders": {"broker-a": [0, 1]}}'
        )
    out: set[QueueRef] = set()
    for topic, groups in doc.items():
        if not topic or not isinstance(groups, dict) or not groups:
            raise OffsetsFormatError(
                f"assign: topic {topic!r} must map broker group names to lists of queue ids"
            )
        for group, ids in groups.items():
            if not group or not isinstance(ids, list) or not ids:
                raise OffsetsFormatError(
                    f"assign: {topic}/{group} must be a non-empty list of queue ids"
                )
            for qid in ids:
                if isinstance(qid, bool) or not isinstance(qid, int):
                    raise OffsetsFormatError(
                        f"assign: {topic}/{group} lists {qid!r}; queue ids are integers"
                    )
                out.add(QueueRef(topic, group, _queue_id(str(qid), "assign", topic, group)))
    return tuple(sorted(out))


def _queue_id(text: object, what: str, topic: str, group: str) -> int:
    if not isinstance(text, str) or not text.isdigit() or (len(text) > 1 and text[0] == "0"):
        raise OffsetsFormatError(
            f"{what}: {topic}/{group} has queue id {text!r}; queue ids are decimal integers >= 0"
        )
    qid = int(text)
    if qid > MAX_QUEUE_ID:
        raise OffsetsFormatError(f"{what}: {topic}/{group} queue id {qid} is too large")
    return qid


def _clip(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
