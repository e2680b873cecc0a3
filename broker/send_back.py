"""Consumer send-back and dead-letter resend (RocketMQ's consumerSendMsgBack): the broker reads the
delivered message from its own log, builds what goes back with common/retry.py's rules, and stores
it through the send path: into %RETRY%<group> with its back-off level as a delay (the schedule
delivers it), into %DLQ%<group> past the limit, or, for `dlq resend`, into the original topic.

The new message is built here, not by the client, because it carries reserved properties (the
original topic and id, the reconsume count) that no client may set."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from raftmq.broker.produce import SendOutcome
from raftmq.common.delay import PROPERTY_DELAY_LEVEL
from raftmq.common.errors import InvalidArgumentError
from raftmq.common.group_config import USE_CONSUMER_LIMIT
from raftmq.common.message import DLQ_TOPIC_PREFIX, Message, validate_group
from raftmq.common.retry import (
    DEAD_LETTER_NOW,
    RetryKind,
    RetryPolicy,
    resend_from_dlq,
    send_back,
)

if TYPE_CHECKING:
    from raftmq.broker.node import BrokerNode

log = logging.getLogger("broker.send_back")

MAX_RECONSUME_TIMES_LIMIT = 10_000  # RocketMQ caps maxReconsumeTimes too; a bound on the count


@dataclass(frozen=True, slots=True)
class SentBack:
    outcome: SendOutcome
    topic: str
    dead_letter: bool
    reconsume_times: int
    delay_level: int
    delay_ms: int  # the retry copy's wait; 0 for a dead letter


class SendBackProcessor:
    def __init__(self, node: BrokerNode) -> None:
        self._node = node

    def _store(self, topic: str, message: Message) -> SendOutcome:
        node = self._node
        _, outcomes = node.sends.send(
            topic, -1, [message], "", 0, node.settings.send_timeout_ms, trusted=True
        )
        return outcomes[0]

    def send_back(
        self,
        group: str,
        msg_id: str,
        max_reconsume_times: int,
        delay_level: int = 0,
        reconsume_times: int = 0,
    ) -> SentBack:
        """`delay_level` > 0 fixes the retry's level (RocketMQ's delayLevelWhenNextConsume);
        `reconsume_times` is the failures the consumer counted itself (an orderly consumer's
        local retries: it reaches the limit with a message whose own count is 0).
        `delay_level` DEAD_LETTER_NOW: to the dead-letter topic whatever the counts and limits
        (the proxy, whose POP consumers the group's limit was applied to already)."""
        validate_group(group)
        for name, value in (
            ("max_reconsume_times", max_reconsume_times),
            ("reconsume_times", reconsume_times),
        ):
            if not 0 <= value <= MAX_RECONSUME_TIMES_LIMIT:
                raise InvalidArgumentError(
                    f"{name} {value} is outside 0..{MAX_RECONSUME_TIMES_LIMIT}"
                )
        node = self._node
        delay = node.delay_policy
        dead_now = delay_level == DEAD_LETTER_NOW
        if dead_now:
            delay_level = 0
        elif delay_level:
            delay.level_delay_ms(delay_level)  # InvalidDelayError names the allowed levels
        node.require_leader()
        stored = node.queries.message_by_id(msg_id)
        # The group's config (`raftmq group config --retry-max N`) is the operator's word and
        # wins over the consumer's own limit; without one the consumer's decides.
        configured = node.store.group_config(group).retry_max_times
        if configured != USE_CONSUMER_LIMIT:
            max_reconsume_times = configured
        policy = RetryPolicy(max_reconsume_times, start_level=min(3, delay.max_level), delay=delay)
        back, decision = send_back(
            stored, group, policy, counted=reconsume_times, dead_letter=dead_now
        )
        if delay_level and decision.kind is RetryKind.RETRY:
            props = {**back.properties, PROPERTY_DELAY_LEVEL: str(delay_level)}
            back = dataclasses.replace(back, properties=props)
            decision = dataclasses.replace(
                decision, delay_level=delay_level, delay_ms=delay.level_delay_ms(delay_level)
            )
        outcome = self._store(decision.topic, back)
        dead = decision.kind is RetryKind.DEAD_LETTER
        if dead:
            log.warning(
                "broker.dead_letter group=%s msg_id=%s new_id=%s reconsume_times=%d",
                group,
                msg_id,
                outcome.msg_id,
                decision.reconsume_times,
            )
        return SentBack(
            outcome,
            decision.topic,
            dead,
            decision.reconsume_times,
            decision.delay_level,
            0 if dead else decision.delay_ms,
        )

    def resend_dead_letter(self, msg_id: str) -> tuple[str, SendOutcome]:
        node = self._node
        node.require_leader()
        stored = node.queries.message_by_id(msg_id)
        if not stored.message.topic.startswith(DLQ_TOPIC_PREFIX):
            raise InvalidArgumentError(
                f"message {msg_id} is in topic {stored.message.topic!r}, not a dead-letter "
                f"topic ({DLQ_TOPIC_PREFIX}<group>); only dead letters can be resent"
            )
        fresh = resend_from_dlq(stored.message)
        outcome = self._store(fresh.topic, fresh)
        log.info(
            "broker.dead_letter_resent msg_id=%s topic=%s new_id=%s",
            msg_id,
            fresh.topic,
            outcome.msg_id,
        )
        return fresh.topic, outcome
