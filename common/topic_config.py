"""A topic's configuration as replicated state: queue counts, permission, ordered and auto flags.

Values and their checks only; the dispatcher applies changes and the store keeps them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from raftmq.common.errors import InvalidTopicConfigError
from raftmq.common.message import validate_topic

MAX_QUEUES_PER_TOPIC = 1024


class Permission(enum.IntFlag):
    """RocketMQ's PermName bits (6 = read and write)."""

    INHERIT = 1
    WRITE = 2
    READ = 4


PERM_READ_WRITE = Permission.READ | Permission.WRITE


@dataclass(frozen=True, slots=True)
class TopicConfig:
    name: str
    read_queue_nums: int = 4
    write_queue_nums: int = 4
    perm: Permission = PERM_READ_WRITE
    ordered: bool = False
    auto_created: bool = False

    @property
    def writable(self) -> bool:
        return Permission.WRITE in self.perm

    @property
    def readable(self) -> bool:
        return Permission.READ in self.perm


def validate_topic_config(cfg: TopicConfig) -> None:
    validate_topic(cfg.name, allow_system=True)
    for label, n in (("read", cfg.read_queue_nums), ("write", cfg.write_queue_nums)):
        if not 1 <= n <= MAX_QUEUES_PER_TOPIC:
            raise InvalidTopicConfigError(
                f"topic {cfg.name!r}: {n} {label} queues; allowed 1..{MAX_QUEUES_PER_TOPIC}"
            )
    if int(cfg.perm) & ~int(Permission.INHERIT | Permission.WRITE | Permission.READ):
        raise InvalidTopicConfigError(
            f"topic {cfg.name!r}: unknown permission bits {int(cfg.perm)}"
        )
