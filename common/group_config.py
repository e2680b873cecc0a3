"""A consumer group's configuration as replicated state (RocketMQ's subscription group config):
its retry limit, whether it may consume at all and whether it may consume by broadcast.
Values, their checks and their fixed-size encoding only; never reads the store or the wire."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from raftmq.common.errors import InvalidArgumentError
from raftmq.common.message import validate_group

# RocketMQ caps maxReconsumeTimes; broker/send_back.py bounds a consumer's own limit alike.
MAX_RETRY_TIMES = 10_000
USE_CONSUMER_LIMIT = -1  # retry_max_times: the consumer's own max_reconsume_times decides

_VALUE = struct.Struct("<iB")  # retry max times, flags
_CONSUME = 0x01
_BROADCAST = 0x02


@dataclass(frozen=True, slots=True)
class GroupConfig:
    """RocketMQ's defaults: consume on, broadcast on, the consumer's retry limit."""

    group: str
    retry_max_times: int = USE_CONSUMER_LIMIT
    consume_enable: bool = True
    broadcast_enable: bool = True

    @property
    def is_default(self) -> bool:
        return self == GroupConfig(self.group)

    def describe(self) -> str:
        """One line for tables and log lines: `retries 3, consume off, broadcast on`."""
        limit = self.retry_max_times
        retries = "the consumer's" if limit == USE_CONSUMER_LIMIT else str(limit)
        return (
            f"retries {retries}, consume {'on' if self.consume_enable else 'off'}, "
            f"broadcast {'on' if self.broadcast_enable else 'off'}"
        )


def max_delivery_attempts(retry_max_times: int, fallback: int) -> int:
    """How many times a POP consumer of the group gets a message before it goes to %DLQ%<group>,
    RocketMQ 5's rule: the proxy answers a consumer's settings with the group's retryMaxTimes + 1
    as the backoff policy's max attempts, and a received message whose deliveries so far reached
    that many goes to the dead-letter topic instead of being delivered again (so a limit of N
    retries means N + 1 deliveries). Without a configured limit, `fallback` (the consumer's own
    backoff policy, else the proxy's default)."""
    if retry_max_times == USE_CONSUMER_LIMIT:
        return fallback
    return retry_max_times + 1


def validate_group_config(cfg: GroupConfig) -> None:
    validate_group(cfg.group)
    if not (
        cfg.retry_max_times == USE_CONSUMER_LIMIT or 0 <= cfg.retry_max_times <= MAX_RETRY_TIMES
    ):
        raise InvalidArgumentError(
            f"consumer group {cfg.group!r}: retry max times {cfg.retry_max_times} is outside "
            f"0..{MAX_RETRY_TIMES} (or {USE_CONSUMER_LIMIT}: the consumer's own limit)"
        )


def encode_value(cfg: GroupConfig) -> bytes:
    """The settings without the name (the record and the store's row key carry it)."""
    flags = (_CONSUME if cfg.consume_enable else 0) | (_BROADCAST if cfg.broadcast_enable else 0)
    return _VALUE.pack(cfg.retry_max_times, flags)


VALUE_SIZE = _VALUE.size


def decode_value(group: str, value: bytes) -> GroupConfig:
    """encode_value's inverse; ValueError for a value of the wrong size or unknown flags."""
    if len(value) != _VALUE.size:
        raise ValueError(f"a group config value of {len(value)} bytes (expected {_VALUE.size})")
    retry, flags = _VALUE.unpack(value)
    if flags & ~(_CONSUME | _BROADCAST):
        raise ValueError(f"a group config with unknown flags {flags:#x}")
    return GroupConfig(group, retry, bool(flags & _CONSUME), bool(flags & _BROADCAST))
