"""RaftLogConfig's defaults are the one definition of the Raft keys the roles embed."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from raftmq.broker.settings import BrokerSettings
from raftmq.raftlog.config import FlushPolicy, RaftLogConfig, config_default


def test_config_default_reads_the_field_default() -> None:
    assert config_default("election_timeout_min_ms", int) == 200
    assert config_default("election_timeout_max_ms", int) == 400
    assert config_default("flush_policy", FlushPolicy) is FlushPolicy.ASYNC_FLUSH
    with pytest.raises(KeyError):
        config_default("no_such_key", int)
    with pytest.raises(TypeError):
        config_default("node_id", str)  # required: no default
    with pytest.raises(TypeError):
        config_default("heartbeat_ms", str)  # wrong type asked for


def test_broker_settings_take_raft_defaults_from_raftlog() -> None:
    raft = {f.name: f.default for f in dataclasses.fields(RaftLogConfig)}
    broker = BrokerSettings()
    for key in (
        "flush_policy",
        "flush_interval_ms",
        "batch_max_bytes",
        "segment_bytes",
        "election_timeout_min_ms",
        "election_timeout_max_ms",
    ):
        assert getattr(broker, key) == raft[key], key
    assert broker.send_timeout_ms == raft["commit_timeout_ms"]
    cfg = broker.raft_config()
    assert cfg.connection_timeout_ms == raft["connection_timeout_ms"]
    assert cfg.max_entry_bytes == raft["max_entry_bytes"]


def test_default_config_is_valid() -> None:
    RaftLogConfig(node_id="127.0.0.1:1", peers=("127.0.0.1:2",), data_dir=Path("x"))
