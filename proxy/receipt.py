"""Receipt handles of the POP API: what a receive hands out with each message and what ack and
change-invisible-duration give back. Pure encode/decode; the text is opaque to clients.

`rmq1~<epoch>~<broker group>~<queue id>~<offset>~<token>~<invisible until, ms>`: the epoch names
the proxy process that issued it (its POP state is in memory), the token the delivery.
"""

from __future__ import annotations

from dataclasses import dataclass

from raftmq.common.pb.apache.rocketmq.v2 import definition_pb2 as v2
from raftmq.proxy.codes import ApiError

VERSION = "rmq1"
SEP = "~"
MAX_HANDLE_CHARS = 512


@dataclass(frozen=True, slots=True)
class ReceiptHandle:
    epoch: str
    broker_group: str
    queue_id: int
    offset: int
    token: int
    invisible_until_ms: int

    def encode(self) -> str:
        return SEP.join(
            (
                VERSION,
                self.epoch,
                self.broker_group,
                str(self.queue_id),
                str(self.offset),
                str(self.token),
                str(self.invisible_until_ms),
            )
        )


def decode(text: str) -> ReceiptHandle:
    """The handle, or ApiError INVALID_RECEIPT_HANDLE saying what is wrong with it."""
    if not text:
        raise ApiError(
            v2.INVALID_RECEIPT_HANDLE,
            "the receipt handle is empty; pass the receipt handle of a received message",
        )
    if len(text) > MAX_HANDLE_CHARS:
        raise ApiError(
            v2.INVALID_RECEIPT_HANDLE,
            f"the receipt handle is {len(text)} "
            f"characters; this proxy's handles have at most {MAX_HANDLE_CHARS}",
        )
    parts = text.split(SEP)
    if len(parts) != 7 or parts[0] != VERSION:
        raise ApiError(
            v2.INVALID_RECEIPT_HANDLE,
            f"{text[:80]!r} is not a receipt handle "
            "this proxy issued; pass the receipt handle of a received message",
        )
    _, epoch, group, *numbers = parts
    if not epoch or not group or not all(n.isdigit() and len(n) <= 19 for n in numbers):
        raise ApiError(v2.INVALID_RECEIPT_HANDLE, f"receipt handle {text[:80]!r} is damaged")
    queue_id, offset, token, until = (int(n) for n in numbers)
    return ReceiptHandle(epoch, group, queue_id, offset, token, until)
