"""Consumer retry and dead letters, RocketMQ's way: the back-off level of each reconsume, when a
message goes to `%DLQ%<group>` instead of `%RETRY%<group>`, and the properties a sent-back message
carries. Pure values: the broker (which decides in RocketMQ's consumerSendMsgBack) and the SDK
(which shows the count and restores the original topic) share it; nothing here sends anything.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from raftmq.common.delay import PROPERTY_DELAY_LEVEL, DelayPolicy
from raftmq.common.message import Message, StoredMessage, dlq_topic, retry_topic

DEFAULT_MAX_RECONSUME_TIMES = 16  # RocketMQ DefaultMQPushConsumer.maxReconsumeTimes (-1 = 16)
RETRY_START_LEVEL = 3  # RocketMQ: delay level = 3 + reconsume times (10 s, 30 s, 1 m, ...)
# A send-back's delay level that asks for the dead-letter topic whatever the counts say:
# RocketMQ's consumerSendMsgBack takes delayLevel < 0 so (the proxy's POP dead letters, which
# the consumer group's retry limit decided already).
DEAD_LETTER_NOW = -1

# RocketMQ's MessageConst names, reserved (validate_message refuses them from clients).
PROPERTY_RETRY_TOPIC = "RETRY_TOPIC"  # the original topic of a message in %RETRY%<group>
PROPERTY_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"  # the id of the first delivery
PROPERTY_RECONSUME_TIME = "RECONSUME_TIME"  # how many times it was consumed and failed
PROPERTY_MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
PROPERTY_DLQ_ORIGIN_TOPIC = "DLQ_ORIGIN_TOPIC"
PROPERTY_DLQ_ORIGIN_MESSAGE_ID = "DLQ_ORIGIN_MESSAGE_ID"


class RetryKind(enum.Enum):
    RETRY = "retry"  # to %RETRY%<group> after the level's delay
    DEAD_LETTER = "dead_letter"  # to %DLQ%<group>, kept for a person to inspect and resend


@dataclass(frozen=True, slots=True)
class RetryDecision:
    kind: RetryKind
    topic: str
    reconsume_times: int  # the count the sent-back message carries (failures so far)
    delay_level: int  # 0 for a dead letter (delivered at once)
    delay_ms: int


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """`max_reconsume_times` retries, then a dead letter; the delay of retry n (0-based) is level
    `start_level + n`, capped at the last level of `delay`."""

    max_reconsume_times: int = DEFAULT_MAX_RECONSUME_TIMES
    start_level: int = RETRY_START_LEVEL
    delay: DelayPolicy = field(default_factory=DelayPolicy)

    def __post_init__(self) -> None:
        if self.max_reconsume_times < 0:
            raise ValueError(f"max_reconsume_times must be >= 0, got {self.max_reconsume_times}")
        if not 1 <= self.start_level <= self.delay.max_level:
            raise ValueError(
                f"start_level {self.start_level} is not a delay level (1..{self.delay.max_level})"
            )

    def delay_level(self, reconsume_times: int) -> int:
        """The level of the retry after `reconsume_times` earlier failures (0 = first failure)."""
        if reconsume_times < 0:
            raise ValueError(f"reconsume_times must be >= 0, got {reconsume_times}")
        return min(self.start_level + reconsume_times, self.delay.max_level)

    def decide(self, group: str, reconsume_times: int) -> RetryDecision:
        """What to do with a message of `group` that failed; `reconsume_times` is the count it
        carried when it was delivered (0 for a first delivery)."""
        if reconsume_times >= self.max_reconsume_times:
            return self.give_up(group, reconsume_times)
        level = self.delay_level(reconsume_times)
        return RetryDecision(
            RetryKind.RETRY,
            retry_topic(group),
            reconsume_times + 1,
            level,
            self.delay.level_delay_ms(level),
        )

    def give_up(self, group: str, reconsume_times: int) -> RetryDecision:
        """To the dead-letter topic now (the limit was reached, or DEAD_LETTER_NOW)."""
        return RetryDecision(RetryKind.DEAD_LETTER, dlq_topic(group), reconsume_times + 1, 0, 0)


def reconsume_times(properties: Mapping[str, str]) -> int:
    """The reconsume count a delivered message carries (0 if none or unreadable)."""
    try:
        return max(0, int(properties.get(PROPERTY_RECONSUME_TIME, "0")))
    except ValueError:
        return 0


def original_topic(message: Message) -> str:
    """The topic the producer sent to: a retried message names it in RETRY_TOPIC."""
    return message.properties.get(PROPERTY_RETRY_TOPIC, message.topic)


def original_message_id(stored: StoredMessage) -> str:
    return stored.message.properties.get(PROPERTY_ORIGIN_MESSAGE_ID, stored.msg_id)


def send_back(
    stored: StoredMessage,
    group: str,
    policy: RetryPolicy,
    *,
    counted: int = 0,
    dead_letter: bool = False,
) -> tuple[Message, RetryDecision]:
    """The message to store for a failed delivery of `stored` to `group`, and why. `counted` is
    the failed deliveries the consumer counted itself (an orderly consumer retries locally, so
    the message's own count stays 0); the larger of it and the message's count decides, unless
    `dead_letter` sends it to the dead-letter topic whatever the count (DEAD_LETTER_NOW).

    The body, tags, keys and user properties are kept; the reserved properties say the original
    topic and message id (the first delivery's, kept across retries), the new reconsume count and,
    for a retry, the delay level. A dead letter also gets DLQ_ORIGIN_TOPIC / _MESSAGE_ID.
    """
    msg = stored.message
    times = max(reconsume_times(msg.properties), counted)
    decision = policy.give_up(group, times) if dead_letter else policy.decide(group, times)
    props = dict(msg.properties)
    props.pop(PROPERTY_DELAY_LEVEL, None)
    topic = original_topic(msg)
    origin_id = original_message_id(stored)
    props[PROPERTY_RETRY_TOPIC] = topic
    props[PROPERTY_ORIGIN_MESSAGE_ID] = origin_id
    props[PROPERTY_RECONSUME_TIME] = str(decision.reconsume_times)
    props[PROPERTY_MAX_RECONSUME_TIMES] = str(policy.max_reconsume_times)
    if decision.kind is RetryKind.RETRY:
        props[PROPERTY_DELAY_LEVEL] = str(decision.delay_level)
    else:
        props[PROPERTY_DLQ_ORIGIN_TOPIC] = topic
        props[PROPERTY_DLQ_ORIGIN_MESSAGE_ID] = origin_id
    back = Message(
        topic=decision.topic,
        body=msg.body,
        tags=msg.tags,
        keys=msg.keys,
        properties=props,
        flag=msg.flag,
        born_timestamp_ms=msg.born_timestamp_ms,
        born_host=msg.born_host,
    )
    return back, decision


def resend_from_dlq(dead: Message) -> Message:
    """A dead letter sent back to its original topic (`raftmq dlq resend`): a fresh first
    delivery, the reserved retry properties dropped, the user's properties and keys kept."""
    reserved = {
        PROPERTY_RETRY_TOPIC,
        PROPERTY_RECONSUME_TIME,
        PROPERTY_MAX_RECONSUME_TIMES,
        PROPERTY_DLQ_ORIGIN_TOPIC,
        PROPERTY_DLQ_ORIGIN_MESSAGE_ID,
        PROPERTY_DELAY_LEVEL,
    }
    props = {k: v for k, v in dead.properties.items() if k not in reserved}
    topic = dead.properties.get(PROPERTY_DLQ_ORIGIN_TOPIC) or original_topic(dead)
    return Message(
        topic=topic,
        body=dead.body,
        tags=dead.tags,
        keys=dead.keys,
        properties=props,
        flag=dead.flag,
        born_timestamp_ms=dead.born_timestamp_ms,
        born_host=dead.born_host,
    )
