"""Fails loudly if pysyncobj moves: the version pin and every private member we override or read."""

from __future__ import annotations

from pysyncobj import SyncObj
from pysyncobj.version import VERSION

from raftmq.raftlog import pysyncobj_compat
from raftmq.raftlog.pysyncobj_compat import RaftNode

# Methods whose private implementation RaftNode replaces (name-mangled as pysyncobj defines them).
OVERRIDDEN = (
    "_SyncObj__getEntries",
    "_SyncObj__applyLogEntries",
    "_SyncObj__tryLogCompaction",
    "_SyncObj__onBecomeLeader",
    "_SyncObj__onMessageReceived",
    "_SyncObj__sendAppendEntries",
)
# Private methods the overrides call.
CALLED = (
    "_SyncObj__generateRaftTimeout",
    "_SyncObj__onLeaderChanged",
    "_SyncObj__setCurrentTerm",
    "_SyncObj__setState",
    "_SyncObj__sendNextNodeIdx",
    "_applyCommand",
    "transferLeadership",
    "addOnTickCallback",
)


def test_version_is_the_pinned_one() -> None:
    assert pysyncobj_compat.PINNED_VERSION == VERSION == "0.3.17"


def test_every_overridden_and_called_member_exists_in_pysyncobj() -> None:
    for name in OVERRIDDEN + CALLED:
        assert callable(getattr(SyncObj, name, None)), f"pysyncobj no longer has {name}"
    for name in OVERRIDDEN:
        assert name in RaftNode.__dict__, f"RaftNode does not override {name}"


def test_patches_replace_the_wire_and_journal_factory() -> None:
    import pysyncobj.pickle
    import pysyncobj.syncobj
    import pysyncobj.tcp_server
    import pysyncobj.transport

    from raftmq.raftlog.wire import FramedConnection

    pysyncobj_compat.install_patches()
    assert pysyncobj.transport.TcpConnection is FramedConnection
    assert pysyncobj.tcp_server.TcpConnection is FramedConnection
    assert getattr(pysyncobj.pickle, "__protocol") == 5
    assert pysyncobj.syncobj.createJournal.__name__ == "create_journal"
