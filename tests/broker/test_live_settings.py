"""Which broker settings change without a restart (broker/live_settings.py, issue 26): all or
nothing, a refused key says why (unknown, read at start, a bad value), the value is checked by
the settings' own rules."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from raftmq.broker.live_settings import LIVE, plan
from raftmq.broker.settings import BrokerSettings

BASE = BrokerSettings(members="n0=127.0.0.1:1/127.0.0.1:2", node_id="n0")


def test_live_keys_change_and_say_their_value() -> None:
    p = plan(BASE, {"retention_ms": "60000", "log_level": "debug"})
    assert not p.refused and p.applied == {"retention_ms": "60000", "log_level": "debug"}
    assert p.settings.retention_ms == 60_000 and BASE.retention_ms != 60_000


def test_refusals_name_the_reason_and_change_nothing() -> None:
    p = plan(BASE, {"retention_ms": "60000", "data_dir": "/x", "nope": "1"})
    assert p.settings is BASE and not p.applied
    assert "restart the node" in p.refused["data_dir"] and "retention_ms" not in p.refused
    assert "no such broker setting" in p.refused["nope"]
    bad = plan(BASE, {"retention_ms": "-1"})
    assert bad.settings is BASE and "must be >= 0" in bad.refused["retention_ms"]
    assert "not an integer" in plan(BASE, {"retention_bytes": "1 GB"}).refused["retention_bytes"]


@settings(deadline=None)
@given(st.dictionaries(st.sampled_from([*sorted(LIVE), "data_dir", "listen"]), st.just("1")))
def test_all_or_nothing(updates: dict[str, str]) -> None:
    p = plan(BASE, updates)
    assert bool(p.applied) != bool(p.refused) or not updates
    if p.refused:
        assert p.settings is BASE
    else:
        assert set(p.applied) == set(updates) and all(k in LIVE for k in updates)
