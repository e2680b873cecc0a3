"""Which stored batch version a broker group writes (docs/design.md, "Stored batch v3: compact
record heads"): a node writes, and its leader accepts from producers, only a version every
member of its group reads. Decisions only; the Raft hello carries what each node reads
(raftlog.raft_node.hello_nonce) and the data port's HELLO answer what the group accepts
(common.frame.server_notes)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from raftmq.common import stored_batch

__all__ = ["READS_ENV", "accepted_version", "reads_version"]

# The newest version this node says it reads, when set lower than what it reads (2): a group
# pinned to v2 on purpose (before a downgrade), and how tests play a node of before.
READS_ENV = "RAFTMQ_STORED_BATCH_READS"


def reads_version(environ: Mapping[str, str] = os.environ) -> int:
    """The newest stored batch version this node tells its peers it reads."""
    text = environ.get(READS_ENV, "").strip()
    if not text:
        return stored_batch.VERSION
    try:
        said = int(text)
    except ValueError:
        raise ValueError(f"{READS_ENV}={text!r} is not a stored batch version") from None
    if not stored_batch.OLDEST_VERSION <= said <= stored_batch.VERSION:
        raise ValueError(
            f"{READS_ENV}={said} is not a version this raftmq reads "
            f"({stored_batch.OLDEST_VERSION}..{stored_batch.VERSION})"
        )
    return said


def accepted_version(own: int, said: Mapping[str, int], peers: Iterable[str]) -> int:
    """The newest version the group may write: the oldest its members read. `said`: what each
    peer's latest Raft hello said (0, or absent, for a node of before or one not heard from
    since this node started: it reads only the oldest)."""
    newest = own
    for peer in peers:
        newest = min(newest, said.get(peer, 0) or stored_batch.OLDEST_VERSION)
    return max(stored_batch.OLDEST_VERSION, newest)
