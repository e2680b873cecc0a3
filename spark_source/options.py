"""Options of the `raftmq` Spark format, parsed and checked before any work (Kafka source names).

Pure: takes the option map Spark hands a data source (keys lower-cased, values strings) and returns
frozen values or raises OptionError with a message a person can act on. Never talks to the
cluster: checks that need it (does the topic exist?) live in source.py.
"""

from __future__ import annotations

import difflib
import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from raftmq.common.errors import InvalidArgumentError, InvalidNameError
from raftmq.common.filter.sql92 import FilterSyntaxError
from raftmq.common.filter.tag import parse_tag_expression
from raftmq.common.message import validate_topic
from raftmq.common.types import QueueRef, parse_address_list
from raftmq.spark_source import offsets as offsets_json
from raftmq.spark_source.offsets import EARLIEST, LATEST, OffsetsFormatError

FORMAT = "raftmq"

# Option names as users write them; Spark lower-cases keys before we see them.
NAMESERVER = "nameServer"
SUBSCRIBE = "subscribe"
SUBSCRIBE_PATTERN = "subscribePattern"
ASSIGN = "assign"
STARTING_OFFSETS = "startingOffsets"
STARTING_TIMESTAMP = "startingTimestamp"
STARTING_BY_TIMESTAMP = "startingOffsetsByTimestamp"
ENDING_OFFSETS = "endingOffsets"
ENDING_TIMESTAMP = "endingTimestamp"
ENDING_BY_TIMESTAMP = "endingOffsetsByTimestamp"
MAX_OFFSETS_PER_TRIGGER = "maxOffsetsPerTrigger"
MIN_OFFSETS_PER_TRIGGER = "minOffsetsPerTrigger"
MAX_TRIGGER_DELAY = "maxTriggerDelay"
FAIL_ON_DATA_LOSS = "failOnDataLoss"
SUB_EXPRESSION = "subExpression"
POLL_TIMEOUT_MS = "pollTimeoutMs"
PULL_BATCH_SIZE = "pullBatchSize"
READ_AHEAD_BATCHES = "readAheadBatches"
MIN_PARTITIONS = "minPartitions"
INCLUDE_HEADERS = "includeHeaders"
TOPIC = "topic"
SEND_TIMEOUT_MS = "sendTimeoutMs"
# Batch writes: the same id on a re-run of the same job stores nothing twice (sink.py).
WRITE_ID = "writeId"
MAX_WRITE_ID_CHARS = 80  # spark-job-<id>-p<partition> stays within the broker's 128
# Test hook of the sink: fail commit() of this micro-batch id after its rows are stored.
FAILPOINT_AFTER_WRITE_BATCH = "failpoint.afterWriteBatch"

SOURCE_OPTIONS = (
    NAMESERVER,
    SUBSCRIBE,
    SUBSCRIBE_PATTERN,
    ASSIGN,
    STARTING_OFFSETS,
    STARTING_TIMESTAMP,
    STARTING_BY_TIMESTAMP,
    ENDING_OFFSETS,
    ENDING_TIMESTAMP,
    ENDING_BY_TIMESTAMP,
    MAX_OFFSETS_PER_TRIGGER,
    MIN_OFFSETS_PER_TRIGGER,
    MAX_TRIGGER_DELAY,
    FAIL_ON_DATA_LOSS,
    SUB_EXPRESSION,
    POLL_TIMEOUT_MS,
    PULL_BATCH_SIZE,
    READ_AHEAD_BATCHES,
    MIN_PARTITIONS,
    INCLUDE_HEADERS,
)
SINK_OPTIONS = (NAMESERVER, TOPIC, SEND_TIMEOUT_MS, WRITE_ID, FAILPOINT_AFTER_WRITE_BATCH)
# Options Spark itself adds to a writer's map; not ours to judge.
SPARK_WRITER_OPTIONS = ("checkpointlocation", "path", "queryname")

DEFAULT_MAX_TRIGGER_DELAY_MS = 15 * 60 * 1000
DEFAULT_POLL_TIMEOUT_MS = 120_000
DEFAULT_PULL_BATCH_SIZE = 1024  # the broker answers at most this many messages per pull anyway
DEFAULT_SEND_TIMEOUT_MS = 60_000
MAX_PULL_BATCH_SIZE = 65_536
# Batches a task makes ahead of Spark (source.read_partition): each up to 8 192 rows or 16 MiB.
DEFAULT_READ_AHEAD_BATCHES = 2
MAX_READ_AHEAD_BATCHES = 8
MAX_MIN_PARTITIONS = 100_000  # Spark tasks one query may ask for per batch
MAX_NAMESERVERS = 16
_DURATION = re.compile(r"^\s*(\d+)\s*(ms|s|m|min|h)?\s*$", re.IGNORECASE)
_DURATION_MS = {"ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000}


class OptionError(ValueError):
    """An option of the raftmq source or sink is missing, unknown, malformed or contradictory."""


class PositionKind(enum.Enum):
    EARLIEST = "earliest"
    LATEST = "latest"
    OFFSETS = "offsets"  # per-queue offsets (EARLIEST / LATEST sentinels allowed)
    TIMESTAMP = "timestamp"  # one store time for every queue
    TIMESTAMPS = "timestamps"  # per-queue store times


@dataclass(frozen=True, slots=True)
class Position:
    """Where a read starts or ends. Queues a per-queue map leaves out use `fallback`."""

    kind: PositionKind
    per_queue: tuple[tuple[QueueRef, int], ...] = ()
    timestamp_ms: int = 0
    option: str = ""  # the option it came from, for messages

    def values(self) -> dict[QueueRef, int]:
        return dict(self.per_queue)


class SubscriptionKind(enum.Enum):
    SUBSCRIBE = "subscribe"
    PATTERN = "subscribePattern"
    ASSIGN = "assign"


@dataclass(frozen=True, slots=True)
class Subscription:
    kind: SubscriptionKind
    topics: tuple[str, ...] = ()  # SUBSCRIBE: the topics; ASSIGN: the topics of `queues`
    pattern: str = ""
    queues: tuple[QueueRef, ...] = ()  # ASSIGN only

    def matches(self, topic: str) -> bool:
        if self.kind is SubscriptionKind.PATTERN:
            return re.fullmatch(self.pattern, topic) is not None
        return topic in self.topics

    def pick_topics(self, all_topics: list[str]) -> list[str]:
        """The topics to route: fixed ones, or every topic the pattern matches (sorted)."""
        if self.kind is SubscriptionKind.PATTERN:
            return sorted(t for t in set(all_topics) if self.matches(t))
        return sorted(self.topics)


@dataclass(frozen=True, slots=True)
class SourceOptions:
    namesrv: tuple[str, ...]
    subscription: Subscription
    starting: Position
    ending: Position
    max_offsets_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = DEFAULT_MAX_TRIGGER_DELAY_MS
    fail_on_data_loss: bool = True
    tag_expression: str = "*"
    poll_timeout_ms: int = DEFAULT_POLL_TIMEOUT_MS
    pull_batch_size: int = DEFAULT_PULL_BATCH_SIZE
    read_ahead_batches: int = DEFAULT_READ_AHEAD_BATCHES  # 0: pulled on Spark's own thread
    min_partitions: int | None = None
    include_headers: bool = False  # Kafka's `headers` column, from the properties
    warnings: tuple[str, ...] = field(default=(), compare=False)


@dataclass(frozen=True, slots=True)
class SinkOptions:
    namesrv: tuple[str, ...]
    topic: str | None = None  # overrides the `topic` column when set
    send_timeout_ms: int = DEFAULT_SEND_TIMEOUT_MS
    write_id: str | None = None  # batch writes: producer ids from it instead of a random one
    failpoint_after_write_batch: int | None = None


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in options.items()}


def _check_known(opts: Mapping[str, str], known: tuple[str, ...], role: str) -> None:
    names = {k.lower(): k for k in known}
    for key in sorted(opts):
        if key in names or (role == "sink" and (key in SPARK_WRITER_OPTIONS or key[:2] == "__")):
            continue
        close = difflib.get_close_matches(key, list(names), n=1, cutoff=0.75)
        hint = f"; did you mean {names[close[0]]!r}?" if close else ""
        raise OptionError(
            f"unknown option {key!r} for the raftmq {role}{hint} "
            f"(known: {', '.join(sorted(known))})"
        )


def parse_namesrv(opts: Mapping[str, str]) -> tuple[str, ...]:
    raw = opts.get(NAMESERVER.lower(), "").strip()
    if not raw:
        raise OptionError(
            f"option {NAMESERVER!r} is required: the NameServer addresses, "
            "e.g. .option('nameServer', '127.0.0.1:9876;127.0.0.1:9877')"
        )
    try:
        out = parse_address_list(raw, NAMESERVER)
    except InvalidArgumentError as exc:
        raise OptionError(exc.message) from None
    if not out or len(out) > MAX_NAMESERVERS:
        raise OptionError(f"{NAMESERVER}: give 1 to {MAX_NAMESERVERS} addresses, got {raw!r}")
    return tuple(out)


def _check_topic(name: str, option: str) -> str:
    try:
        validate_topic(name)
    except InvalidNameError as exc:
        raise OptionError(f"{option}: {exc}") from None
    return name


def _int(opts: Mapping[str, str], name: str, *, low: int, high: int = 2**63 - 1) -> int | None:
    raw = opts.get(name.lower())
    if raw is None:
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        raise OptionError(f"{name} must be an integer, got {raw!r}") from None
    if not low <= value <= high:
        raise OptionError(f"{name} must be within {low}..{high}, got {value}")
    return value


def _bool(opts: Mapping[str, str], name: str, default: bool) -> bool:
    raw = opts.get(name.lower())
    if raw is None:
        return default
    low = raw.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    raise OptionError(f"{name} must be true or false, got {raw!r}")


def parse_duration_ms(raw: str, name: str) -> int:
    m = _DURATION.match(raw)
    if m is None:
        raise OptionError(f"{name} must be a duration such as 500ms, 30s, 15m or 1h; got {raw!r}")
    return int(m.group(1)) * _DURATION_MS[(m.group(2) or "ms").lower()]


def parse_subscription(opts: Mapping[str, str]) -> Subscription:
    given = [n for n in (SUBSCRIBE, SUBSCRIBE_PATTERN, ASSIGN) if n.lower() in opts]
    if len(given) != 1:
        which = " and ".join(given) if given else "none"
        raise OptionError(
            f"give exactly one of {SUBSCRIBE!r} (topics, comma-separated), "
            f"{SUBSCRIBE_PATTERN!r} (a Python regular expression) or {ASSIGN!r} "
            f'(JSON {{"topic": {{"broker-a": [0, 1]}}}}); got {which}'
        )
    name = given[0]
    raw = opts[name.lower()]
    if name == SUBSCRIBE:
        topics = sorted({t.strip() for t in raw.split(",") if t.strip()})
        if not topics:
            raise OptionError(f"{SUBSCRIBE} names no topic: {raw!r}")
        return Subscription(
            SubscriptionKind.SUBSCRIBE, tuple(_check_topic(t, SUBSCRIBE) for t in topics)
        )
    if name == SUBSCRIBE_PATTERN:
        if not raw.strip():
            raise OptionError(f"{SUBSCRIBE_PATTERN} is empty")
        try:
            re.compile(raw)
        except re.error as exc:
            raise OptionError(
                f"{SUBSCRIBE_PATTERN} {raw!r} is not a regular expression: {exc}"
            ) from None
        return Subscription(SubscriptionKind.PATTERN, pattern=raw)
    try:
        queues = offsets_json.parse_assignment(raw)
    except OffsetsFormatError as exc:
        raise OptionError(str(exc)) from None
    topics = sorted({q.topic for q in queues})
    for t in topics:
        _check_topic(t, ASSIGN)
    return Subscription(SubscriptionKind.ASSIGN, tuple(topics), queues=queues)


def _position(
    opts: Mapping[str, str],
    *,
    offsets_name: str,
    timestamp_name: str,
    by_timestamp_name: str,
    default: PositionKind,
    ending: bool,
    subscription: Subscription,
) -> Position:
    given = [n for n in (offsets_name, timestamp_name, by_timestamp_name) if n.lower() in opts]
    if len(given) > 1:
        raise OptionError(f"give at most one of {', '.join(given)}; they say the same thing")
    if not given:
        return Position(default, option=offsets_name)
    name = given[0]
    raw = opts[name.lower()].strip()
    if name == timestamp_name:
        ts = _int(opts, name, low=0)
        assert ts is not None
        return Position(PositionKind.TIMESTAMP, timestamp_ms=ts, option=name)
    if name == offsets_name and raw.lower() in ("earliest", "latest"):
        return Position(PositionKind(raw.lower()), option=name)

    def check_offset(q: QueueRef, value: int) -> str | None:
        if value >= 0:
            return None
        if value == LATEST:
            return None
        if value == EARLIEST and not ending:
            return None
        allowed = "-1 (latest) or an offset >= 0" if ending else "-2 (earliest), -1 (latest)"
        return f"{value} is not allowed; use {allowed}" + ("" if ending else " or an offset >= 0")

    def check_timestamp(q: QueueRef, value: int) -> str | None:
        return None if value >= 0 else f"timestamp {value} must be >= 0 (ms since the epoch)"

    is_ts = name == by_timestamp_name
    if not raw.startswith("{"):
        words = "earliest, latest" if not ending else "latest"
        raise OptionError(
            f"{name} must be {'a JSON object' if is_ts else words + ' or a JSON object'} of "
            f"topic -> broker group -> queue id -> {'timestamp' if is_ts else 'offset'}, "
            f'e.g. {{"orders": {{"broker-a": {{"0": 42}}}}}}; got {raw[:80]!r}'
        )
    try:
        values = offsets_json.parse(
            raw, what=name, check_value=check_timestamp if is_ts else check_offset
        )
    except OffsetsFormatError as exc:
        raise OptionError(str(exc)) from None
    for q in values:
        if not subscription.matches(q.topic):
            raise OptionError(f"{name} names topic {q.topic!r}, which the query does not read")
        if subscription.kind is SubscriptionKind.ASSIGN and q not in subscription.queues:
            raise OptionError(
                f"{name} names {q.topic}/{q.broker_group}/{q.queue_id}, which {ASSIGN} leaves out"
            )
    kind = PositionKind.TIMESTAMPS if is_ts else PositionKind.OFFSETS
    return Position(kind, tuple(sorted(values.items())), option=name)


def parse_source_options(options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
    """All source options checked at once; the first problem raises OptionError."""
    opts = _lower(options)
    _check_known(opts, SOURCE_OPTIONS, "source")
    namesrv = parse_namesrv(opts)
    subscription = parse_subscription(opts)
    warnings: list[str] = []
    starting = _position(
        opts,
        offsets_name=STARTING_OFFSETS,
        timestamp_name=STARTING_TIMESTAMP,
        by_timestamp_name=STARTING_BY_TIMESTAMP,
        default=PositionKind.LATEST if streaming else PositionKind.EARLIEST,
        ending=False,
        subscription=subscription,
    )
    ending_given = [
        n for n in (ENDING_OFFSETS, ENDING_TIMESTAMP, ENDING_BY_TIMESTAMP) if n.lower() in opts
    ]
    if streaming and ending_given:
        raise OptionError(
            f"{ending_given[0]} is for batch queries (spark.read); a stream has no end"
        )
    ending = _position(
        opts,
        offsets_name=ENDING_OFFSETS,
        timestamp_name=ENDING_TIMESTAMP,
        by_timestamp_name=ENDING_BY_TIMESTAMP,
        default=PositionKind.LATEST,
        ending=True,
        subscription=subscription,
    )
    if ending.kind is PositionKind.EARLIEST:
        raise OptionError(f"{ENDING_OFFSETS}=earliest would read nothing; use latest or JSON")
    if not streaming and starting.kind is PositionKind.LATEST:
        raise OptionError(
            f"{STARTING_OFFSETS}=latest would read nothing in a batch query; "
            "use earliest, JSON offsets or a timestamp"
        )
    if (
        not streaming
        and starting.kind is PositionKind.OFFSETS
        and any(v == LATEST for _, v in starting.per_queue)
    ):
        raise OptionError(f"{STARTING_OFFSETS}: -1 (latest) is not allowed in a batch query")
    max_per = _int(opts, MAX_OFFSETS_PER_TRIGGER, low=1)
    min_per = _int(opts, MIN_OFFSETS_PER_TRIGGER, low=1)
    delay_raw = opts.get(MAX_TRIGGER_DELAY.lower())
    delay_ms = (
        DEFAULT_MAX_TRIGGER_DELAY_MS
        if delay_raw is None
        else parse_duration_ms(delay_raw, MAX_TRIGGER_DELAY)
    )
    if max_per is not None and min_per is not None and min_per > max_per:
        raise OptionError(
            f"{MIN_OFFSETS_PER_TRIGGER} ({min_per}) is above {MAX_OFFSETS_PER_TRIGGER} ({max_per})"
        )
    if delay_raw is not None and min_per is None:
        raise OptionError(f"{MAX_TRIGGER_DELAY} only applies with {MIN_OFFSETS_PER_TRIGGER}")
    if not streaming:
        for name, value in ((MAX_OFFSETS_PER_TRIGGER, max_per), (MIN_OFFSETS_PER_TRIGGER, min_per)):
            if value is not None:
                warnings.append(f"{name} applies to streaming queries; a batch read ignores it")
        max_per = min_per = None
    expression = opts.get(SUB_EXPRESSION.lower(), "*").strip() or "*"
    try:
        parse_tag_expression(expression, strict=True)
    except FilterSyntaxError as exc:
        raise OptionError(
            f"{SUB_EXPRESSION} {expression!r} is not a tag expression: {exc}"
        ) from None
    poll_ms = _int(opts, POLL_TIMEOUT_MS, low=100, high=24 * 3_600_000)
    batch = _int(opts, PULL_BATCH_SIZE, low=1, high=MAX_PULL_BATCH_SIZE)
    ahead = _int(opts, READ_AHEAD_BATCHES, low=0, high=MAX_READ_AHEAD_BATCHES)
    return SourceOptions(
        namesrv=namesrv,
        subscription=subscription,
        starting=starting,
        ending=ending,
        max_offsets_per_trigger=max_per,
        min_offsets_per_trigger=min_per,
        max_trigger_delay_ms=delay_ms,
        fail_on_data_loss=_bool(opts, FAIL_ON_DATA_LOSS, True),
        tag_expression=expression,
        poll_timeout_ms=DEFAULT_POLL_TIMEOUT_MS if poll_ms is None else poll_ms,
        pull_batch_size=DEFAULT_PULL_BATCH_SIZE if batch is None else batch,
        read_ahead_batches=DEFAULT_READ_AHEAD_BATCHES if ahead is None else ahead,
        min_partitions=_int(opts, MIN_PARTITIONS, low=1, high=MAX_MIN_PARTITIONS),
        include_headers=_bool(opts, INCLUDE_HEADERS, False),
        warnings=tuple(warnings),
    )


def include_headers(options: Mapping[str, str]) -> bool:
    """includeHeaders alone (the schema depends on it, before the other options are parsed)."""
    return _bool(_lower(options), INCLUDE_HEADERS, False)


def parse_sink_options(options: Mapping[str, str]) -> SinkOptions:
    opts = _lower(options)
    _check_known(opts, SINK_OPTIONS, "sink")
    topic = opts.get(TOPIC.lower())
    timeout = _int(opts, SEND_TIMEOUT_MS, low=100, high=3_600_000)
    return SinkOptions(
        namesrv=parse_namesrv(opts),
        topic=_check_topic(topic.strip(), TOPIC) if topic is not None else None,
        send_timeout_ms=DEFAULT_SEND_TIMEOUT_MS if timeout is None else timeout,
        write_id=_write_id(opts.get(WRITE_ID.lower())),
        failpoint_after_write_batch=_int(opts, FAILPOINT_AFTER_WRITE_BATCH, low=0),
    )


_WRITE_ID_CHARS = re.compile(r"[A-Za-z0-9_.-]+")


def _write_id(raw: str | None) -> str | None:
    """`writeId`: 1..80 characters of letters, digits, `_`, `.` and `-` (it becomes part of the
    broker's producer ids, which refuse anything else)."""
    if raw is None:
        return None
    value = raw.strip()
    if not value or len(value) > MAX_WRITE_ID_CHARS or not _WRITE_ID_CHARS.fullmatch(value):
        raise OptionError(
            f"{WRITE_ID}: give 1 to {MAX_WRITE_ID_CHARS} letters, digits, '_', '.' or '-', "
            f"got {raw!r} (e.g. .option('{WRITE_ID}', 'orders-2026-11-27'))"
        )
    return value
