"""The Raft journal of one node: segment files of CRC-framed records, position indexes, term runs.

SegmentJournal (segment_journal.py) is the one public class; format, segments, cache, term_runs and
recovery hold its parts. Nothing here imports the rest of raftmq but raftlog's errors and records.
"""

from __future__ import annotations

from raftmq.raftlog.journal.format import HEADER_BYTES
from raftmq.raftlog.journal.segment_journal import SegmentInfo, SegmentJournal
from raftmq.raftlog.journal.segments import (
    MAX_SEGMENT_RECORDS,
    index_name,
    pending_index_name,
    segment_name,
)

__all__ = [
    "HEADER_BYTES",
    "MAX_SEGMENT_RECORDS",
    "SegmentInfo",
    "SegmentJournal",
    "index_name",
    "pending_index_name",
    "segment_name",
]
