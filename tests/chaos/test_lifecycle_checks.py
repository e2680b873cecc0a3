"""The lifecycle checkers (chaos/lifecycle_checks.py) on hand-made histories: each violation they
must flag, each legal behaviour they must let through; and the lifecycle scenarios' wiring."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from raftmq.chaos.history import Op, OpType
from raftmq.chaos.lifecycle_checks import (
    check_delay,
    check_lifecycle,
    check_orderly,
    check_retry,
    check_txn,
)
from raftmq.chaos.lifecycle_workload import delay_of, intent_of
from raftmq.chaos.runner import RunOptions, _chaos_spec, retry_delays_s
from raftmq.chaos.scenarios import SCENARIOS, by_name, ci_set
from raftmq.chaos.workload import main as workload_main


def send(msg_id: str, t: float, outcome: OpType = "ok", **value: Any) -> list[Op]:
    v = {"id": msg_id, "key": None, **value}
    return [Op(t, "p", "invoke", "send", v), Op(t + 0.01, "p", outcome, "send", v)]


def recv(msg_id: str, t: float, **value: Any) -> Op:
    return Op(t, "c", "ok", "recv", {"id": msg_id, "key": None, **value})


# ---- transactions -------------------------------------------------------------------------------


def test_txn_committed_and_delivered_rolled_back_and_not_is_valid() -> None:
    ops = [
        *send("a", 1, intent="commit", half=True),
        *send("b", 1, "fail", intent="rollback", half=True),
        *send("c", 1, intent="check-commit", half=True),
        *send("d", 1, "fail", intent="check-rollback", half=True),
        Op(4, "txn-checker", "info", "event", {"kind": "check", "id": "c", "answer": "commit"}),
        recv("a", 2),
        recv("c", 5),
    ]
    r = check_txn(ops)
    assert r.valid and r.promised == 2 and r.checks == 1


def test_txn_flags_a_lost_commit_and_a_delivered_rollback() -> None:
    ops = [
        *send("a", 1, intent="check-commit", half=True),
        *send("b", 1, "fail", intent="check-rollback", half=True),
        recv("b", 3),
    ]
    r = check_txn(ops)
    assert not r.valid
    assert (r.lost, r.half_delivered) == (1, 1)
    assert r.samples == {"lost": ["a"], "half_delivered": ["b"]}


def test_txn_a_commit_whose_half_was_never_stored_is_not_promised() -> None:
    ops = send("a", 1, "fail", intent="commit", half=False)
    assert check_txn(ops).valid


# ---- delay ------------------------------------------------------------------------------------


def test_delay_on_time_once_is_valid_and_a_re_read_is_legal() -> None:
    ops = [
        *send("a", 1.0, delay_ms=2_000),
        recv("a", 3.05, queue="g:0", offset=7),
        recv("a", 9.0, queue="g:0", offset=7),  # the consumer read it again: one position
    ]
    r = check_delay(ops)
    assert r.valid and r.delivered == 1


def test_delay_flags_early_twice_and_lost() -> None:
    ops = [
        *send("early", 1.0, delay_ms=2_000),
        recv("early", 2.5, queue="g:0", offset=1),
        *send("twice", 1.0, delay_ms=1_000),
        recv("twice", 2.1, queue="g:0", offset=2),
        recv("twice", 2.2, queue="g:1", offset=0),  # stored into the topic a second time
        *send("lost", 1.0, delay_ms=1_000),
    ]
    r = check_delay(ops)
    assert (r.early, r.delivered_twice, r.lost) == (1, 1, 1)
    assert r.worst_early_s == pytest.approx(0.5)
    assert not r.valid


def test_delay_an_unacknowledged_send_is_not_promised() -> None:
    ops = send("x", 1.0, "info", delay_ms=1_000)
    assert check_delay(ops).valid


# ---- retry ------------------------------------------------------------------------------------

DELAYS = [0.5, 1.0, 1.5]


def test_retry_backed_off_then_consumed_is_valid() -> None:
    ops = [
        *send("a", 1.0),
        recv("a", 1.1, reconsume=0, result="later"),
        recv("a", 1.7, reconsume=1, result="later"),
        recv("a", 2.8, reconsume=2, result="ok"),
    ]
    r = check_retry(ops, DELAYS)
    assert r.valid and r.retries == 2


def test_retry_flags_an_early_retry_and_a_message_never_consumed() -> None:
    ops = [
        *send("a", 1.0),
        recv("a", 1.1, reconsume=0, result="later"),
        recv("a", 1.3, reconsume=1, result="ok"),  # 0.2 s after the failure: 0.5 s due
        *send("b", 1.0),
        recv("b", 1.1, reconsume=0, result="later"),  # failed, never came back
    ]
    r = check_retry(ops, DELAYS)
    assert (r.early, r.lost) == (1, 1)
    assert r.samples["lost"] == ["b"] and r.samples["early"] == ["a"]


def test_retry_a_local_retry_at_the_same_count_is_not_early() -> None:
    # The send-back failed (leader killed): the consumer retries locally, same count.
    ops = [
        *send("a", 1.0),
        recv("a", 1.1, reconsume=0, result="later"),
        recv("a", 2.1, reconsume=0, result="later"),
        recv("a", 2.7, reconsume=1, result="ok"),
    ]
    assert check_retry(ops, DELAYS).valid


# ---- orderly ----------------------------------------------------------------------------------


def orderly(msg_id: str, queue: str, start: float, end: float) -> Op:
    return recv(msg_id, end, queue=queue, offset=0, start=start, end=end)


def test_orderly_one_at_a_time_per_queue_is_valid_across_queues() -> None:
    ops = [
        *send("a", 0),
        *send("b", 0),
        *send("c", 0),
        orderly("a", "g:0", 1.0, 1.1),
        orderly("b", "g:0", 1.1, 1.2),
        orderly("c", "g:1", 1.05, 1.15),  # another queue may overlap
    ]
    assert check_orderly(ops).valid


def test_orderly_flags_two_calls_of_one_queue_at_once() -> None:
    ops = [orderly("a", "g:0", 1.0, 1.3), orderly("b", "g:0", 1.1, 1.2)]
    r = check_orderly(ops)
    assert r.overlap == 1 and r.samples["overlap"] == ["b"] and not r.valid


# ---- wiring -----------------------------------------------------------------------------------


def test_check_lifecycle_dispatches_and_refuses_unknown_modes() -> None:
    assert check_lifecycle([], "queue") is None
    assert check_lifecycle([], "proxy") is None  # the queue checker's ops, through the proxy
    for mode in ("txn", "delay", "retry", "orderly"):
        r = check_lifecycle([], mode)
        assert r is not None and r.mode == mode and r.valid
    with pytest.raises(ValueError, match="unknown workload mode"):
        check_lifecycle([], "bogus")


def test_lifecycle_scenarios_are_in_the_full_list_only() -> None:
    names = {s.name: s for s in SCENARIOS}
    for name, mode in (
        ("txn-leader-kill", "txn"),
        ("delay-leader-kill", "delay"),
        ("retry-leader-kill", "retry"),
        ("orderly-leader-kill", "orderly"),
    ):
        s = names[name]
        assert s.workload == mode and not s.ci
        assert s.schedule(1).faults[0].kind.value == "kill"
    assert len(ci_set()) == 6


def test_retry_delays_follow_the_scenario_levels() -> None:
    # Retry n uses level 3 + n: 500ms, 1s, 1500ms, ... of the scaled levels.
    assert retry_delays_s(by_name("retry-leader-kill"))[:3] == [0.5, 1.0, 1.5]
    assert retry_delays_s(by_name("leader-kill"))[:2] == [10.0, 30.0]


def test_intents_and_delays_cover_every_case() -> None:
    assert {intent_of(i) for i in range(4)} == {
        "commit",
        "rollback",
        "check-commit",
        "check-rollback",
    }
    delays = [delay_of(i) for i in range(200)]
    assert min(delays) >= 500 and max(delays) <= 8_000 and len(set(delays)) > 100


def test_workload_refuses_an_unknown_mode(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        workload_main(["--namesrv", "x:1", "--topic", "t", "--out", "/dev/null", "--mode", "x"])
    assert "invalid choice" in capsys.readouterr().err


def test_scenario_settings_are_laid_over_the_cluster_description(tmp_path: Path) -> None:
    spec = _chaos_spec(RunOptions("txn-leader-kill", out_dir=tmp_path), by_name("txn-leader-kill"))
    broker = spec.settings["broker"]
    assert broker["transaction_timeout_ms"] == 2_000
    assert broker["heartbeat_interval_ms"] == 2_000  # chaos/cluster.toml's own stays
    plain = _chaos_spec(RunOptions("leader-kill", out_dir=tmp_path), by_name("leader-kill"))
    assert "transaction_timeout_ms" not in plain.settings["broker"]


def test_the_proxy_scenario_starts_a_proxy_and_points_its_workload_at_it(tmp_path: Path) -> None:
    scenario = by_name("proxy-leader-kill")
    assert scenario.workload == "proxy" and scenario.proxy and not scenario.ci
    assert scenario.schedule(1).faults[0].kind.value == "kill"
    spec = _chaos_spec(RunOptions(scenario.name, out_dir=tmp_path), scenario)
    [proxy] = [p for p in spec.processes() if p.role == "proxy"]
    assert proxy.name == "proxy-0" and proxy.ready_prefix == "proxy.started"
    assert "--offset-commit-interval-ms" in proxy.argv  # the scenario's [settings.proxy]
    # Only the scenario that goes through it pays for a proxy process.
    plain = _chaos_spec(RunOptions("leader-kill", out_dir=tmp_path), by_name("leader-kill"))
    assert not [p for p in plain.processes() if p.role == "proxy"]


def test_the_proxy_workload_needs_its_address(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        workload_main(["--namesrv", "x:1", "--topic", "t", "--out", "/dev/null", "--mode", "proxy"])
    assert "--proxy HOST:PORT" in capsys.readouterr().err
