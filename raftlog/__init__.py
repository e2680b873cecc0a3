"""raftmq's replicated log: one broker group's CommitLog on raftmq's own Raft core (and the
controllers' on pysyncobj), over our journal.

IMPLEMENTATION says whether the core's modules run compiled by mypyc ("mypyc") or from source
("python"), and IMPLEMENTATION_REASON why (raftlog/compiled.py).
"""

from pathlib import Path

from raftmq.raftlog.compiled import install as _install

IMPLEMENTATION, IMPLEMENTATION_REASON = _install(Path(__file__).resolve().parent)
