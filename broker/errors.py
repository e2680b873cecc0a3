"""Typed failures of the broker's storage core, each saying whose fault it is.

The caller's (an invalid message, topic or group name), the data's (a chunk that does not decode)
or the system's (a gap in dispatch, a full store). Nothing here knows gRPC; the broker maps them.
"""

from __future__ import annotations


class BrokerError(Exception):
    """Base of every error raised by the broker package."""


class BrokerInputError(BrokerError, ValueError):
    """The caller sent something the broker refuses (bad name, oversized body); fix and resend."""


class InvalidMessageError(BrokerInputError):
    """A message breaks a rule (size, properties, tag, keys); the text says which and the limit."""


class InvalidNameError(BrokerInputError):
    """A topic, consumer group, producer id or broker group name breaks the naming rules."""


class InvalidTopicConfigError(BrokerInputError):
    """A topic configuration outside the allowed ranges (queue counts, permission bits)."""


class InvalidMessageIdError(BrokerInputError):
    """A string that is not a raftmq message id."""


class MalformedBatchError(BrokerError, ValueError):
    """A record batch whose bytes do not decode: a bug or corruption, never served as data."""


class StoreError(BrokerError):
    """The message store cannot do what was asked (system's fault)."""


class DispatchGapError(BrokerError):
    """Entries or outputs arrived out of order: the store would silently miss entries."""

    def __init__(self, expected_index: int, got_index: int) -> None:
        super().__init__(
            f"dispatch expected raft index {expected_index} next but got {got_index}; "
            "the store only accepts committed entries in order, without gaps"
        )
        self.expected_index = expected_index
        self.got_index = got_index


class StoreFullError(StoreError):
    """The lmdb map is full; the broker must be restarted with a larger map_size_bytes."""


class DispatcherStoppedError(BrokerError):
    """The dispatcher thread is not running (stopped, or stopped itself after a failure)."""
