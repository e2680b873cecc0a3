"""Transactional half messages: table tests of the end rules and check-back schedule, producer
choice, and a Hypothesis stateful test: no half message is ever visible unless committed, and each
committed one becomes visible exactly once, through checks, moves and leader changes."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule

from raftmq.broker.schedule import MessageRef
from raftmq.broker.transaction import (
    CheckAction,
    EndOutcome,
    MoveAction,
    Resolution,
    TransactionBook,
    TxnSettings,
    TxnState,
    choose_producer,
)
from raftmq.common.errors import TransactionConflictError, TransactionNotFoundError

COMMIT, ROLLBACK, UNKNOWN = Resolution.COMMIT, Resolution.ROLLBACK, Resolution.UNKNOWN


def ref(n: int) -> MessageRef:
    return MessageRef(n, 0, 0, "orders", 0)


def book(**kw: int) -> TransactionBook:
    return TransactionBook(TxnSettings(**kw))


def test_defaults_are_rocketmq_s() -> None:
    s = TxnSettings()
    assert (s.transaction_timeout_ms, s.check_interval_ms, s.max_checks) == (6_000, 60_000, 15)


def test_commit_is_visible_once_and_idempotent() -> None:
    b = book()
    b.apply_half("t1", "pg", "c1", ref(1), store_ms=100)
    assert b.state("t1") is TxnState.HALF
    first = b.apply_end("t1", COMMIT, 200)
    assert first.outcome is EndOutcome.VISIBLE and first.ref == ref(1) and first.error() is None
    again = b.apply_end("t1", COMMIT, 300)
    assert again.outcome is EndOutcome.ALREADY and again.ref is None and again.error() is None
    b.validate_end("t1", COMMIT)  # no error: a retried commit succeeds
    conflict = b.apply_end("t1", ROLLBACK, 400)
    assert conflict.outcome is EndOutcome.CONFLICT and b.state("t1") is TxnState.COMMITTED
    with pytest.raises(TransactionConflictError, match="already committed"):
        b.validate_end("t1", ROLLBACK)


def test_rollback_then_commit_is_a_typed_error_and_changes_nothing() -> None:
    b = book()
    b.apply_half("t1", "pg", "c1", ref(1), 100)
    assert b.apply_end("t1", ROLLBACK, 200).outcome is EndOutcome.DROPPED
    assert b.apply_end("t1", ROLLBACK, 210).outcome is EndOutcome.ALREADY
    res = b.apply_end("t1", COMMIT, 220)
    error = res.error()
    assert isinstance(error, TransactionConflictError)
    assert "rolled back" in error.message and error.code == "TRANSACTION_CONFLICT"
    assert b.state("t1") is TxnState.ROLLED_BACK


def test_unknown_id_is_a_typed_error() -> None:
    b = book()
    res = b.apply_end("nope", COMMIT, 1)
    assert res.outcome is EndOutcome.NOT_FOUND
    assert isinstance(res.error(), TransactionNotFoundError)
    with pytest.raises(TransactionNotFoundError, match="nope"):
        b.validate_end("nope", ROLLBACK)


def test_ended_ids_are_forgotten_after_retention() -> None:
    b = book(ended_retention_ms=1_000)
    b.apply_half("t1", "pg", "c1", ref(1), 0)
    b.apply_end("t1", COMMIT, 10)
    assert b.apply_end("t1", COMMIT, 1_009).outcome is EndOutcome.ALREADY
    assert b.apply_end("t1", COMMIT, 1_010).outcome is EndOutcome.NOT_FOUND
    assert b.ended_count == 0


def test_check_schedule_then_move_after_max_checks() -> None:
    b = book(transaction_timeout_ms=6_000, check_interval_ms=60_000, max_checks=2)
    b.producer_up("pg", "c1")
    b.apply_half("t1", "pg", "c1", ref(1), 1_000, check_immunity_ms=None)
    assert b.next_check_ms() == 7_000
    assert b.due_checks(6_999) == []
    [first] = b.due_checks(7_000)
    assert first == CheckAction("t1", "pg", "c1", ref(1))
    assert b.due_checks(7_000) == [], "proposed, not applied: not taken twice"
    assert b.apply_check_sent("t1", 7_000, "c1")
    assert b.apply_end("t1", UNKNOWN, 7_100, from_check=True).outcome is EndOutcome.STILL_HALF
    assert b.next_check_ms() == 67_000
    [second] = b.due_checks(67_000)
    assert isinstance(second, CheckAction)
    b.apply_check_sent("t1", 67_000, second.client)
    [move] = b.due_checks(127_000)
    assert move == MoveAction("t1", ref(1), 2)
    assert b.apply_moved("t1", 127_000) == ref(1)
    assert b.state("t1") is TxnState.MOVED and b.open_count == 0
    assert b.apply_end("t1", ROLLBACK, 130_000).outcome is EndOutcome.ALREADY
    assert b.apply_end("t1", COMMIT, 130_000).outcome is EndOutcome.CONFLICT


def test_check_immunity_and_no_live_producer() -> None:
    b = book()
    b.apply_half("t1", "pg", "gone", ref(1), 0, check_immunity_ms=30_000)
    assert b.next_check_ms() == 30_000
    [check] = b.due_checks(30_000)
    assert isinstance(check, CheckAction) and check.client is None, "counted, nobody to ask"
    b.apply_check_sent("t1", 30_000, None)
    assert b.get("t1") is not None and b.get("t1").checks == 1  # type: ignore[union-attr]


def test_end_racing_a_check_wins_and_the_check_is_dropped() -> None:
    b = book()
    b.producer_up("pg", "c1")
    b.apply_half("t1", "pg", "c1", ref(1), 0)
    assert len(b.due_checks(10_000)) == 1
    assert b.apply_end("t1", COMMIT, 10_001).outcome is EndOutcome.VISIBLE
    assert not b.apply_check_sent("t1", 10_002, "c1"), "ended: do not send"
    assert b.apply_moved("t1", 10_003) is None


def test_lost_leadership_and_failed_proposals_free_the_window() -> None:
    b = book()
    b.apply_half("t1", "pg", "c1", ref(1), 0)
    assert len(b.due_checks(6_000)) == 1 and b.due_checks(6_000) == []
    b.proposal_failed(["t1"])
    assert len(b.due_checks(6_000)) == 1
    b.lost_leadership()
    assert len(b.due_checks(6_000)) == 1


def test_round_robin_skips_the_member_that_failed_last() -> None:
    picks = []
    cursor = 0
    for _ in range(4):
        pick, cursor = choose_producer(["c3", "c1", "c2"], cursor, avoid=None)
        picks.append(pick)
    assert picks == ["c1", "c2", "c3", "c1"]
    assert choose_producer(["c1", "c2"], 0, avoid="c1") == ("c2", 1)
    assert choose_producer(["c1", "c2"], 1, avoid="c1") == ("c2", 2)
    assert choose_producer(["c1"], 5, avoid="c1") == ("c1", 6), "the only member is asked"
    assert choose_producer([], 3, avoid=None) == (None, 3)


def test_sender_gone_another_member_answers() -> None:
    b = book()
    for c in ("c1", "c2"):
        b.producer_up("pg", c)
    b.apply_half("t1", "pg", "c1", ref(1), 0)
    b.producer_down("pg", "c1")  # the sending producer was killed
    [check] = b.due_checks(6_000)
    assert isinstance(check, CheckAction) and check.client == "c2"
    b.apply_check_sent("t1", 6_000, "c2")
    assert b.apply_end("t1", COMMIT, 6_050, from_check=True).outcome is EndOutcome.VISIBLE


def test_duplicate_half_id_and_bad_settings() -> None:
    b = book()
    b.apply_half("t1", "pg", "c1", ref(1), 0)
    with pytest.raises(ValueError, match="unique"):
        b.apply_half("t1", "pg", "c1", ref(2), 1)
    with pytest.raises(ValueError, match="check_interval_ms"):
        TxnSettings(check_interval_ms=0)
    with pytest.raises(ValueError, match="max_checks"):
        TxnSettings(max_checks=-1)


# ---- stateful: two replicas, a leader that checks, producers that answer -------------------------


class TransactionMachine(RuleBasedStateMachine):
    txns = Bundle("txns")

    def __init__(self) -> None:
        super().__init__()
        cfg = TxnSettings(transaction_timeout_ms=100, check_interval_ms=50, max_checks=3)
        self.leader = TransactionBook(cfg)
        self.follower = TransactionBook(cfg)
        self.now = 0
        self.n = 0
        self.visible: list[str] = []  # every VISIBLE outcome, in apply order
        self.committed: set[str] = set()  # the model: ends that should have made it visible
        self.ended_other: set[str] = set()  # rolled back or moved
        self.stored_at: dict[str, int] = {}

    def _apply_end(self, txn_id: str, resolution: Resolution, from_check: bool = False) -> None:
        res = self.leader.apply_end(txn_id, resolution, self.now, from_check=from_check)
        assert res == self.follower.apply_end(txn_id, resolution, self.now, from_check=from_check)
        if res.outcome is EndOutcome.VISIBLE:
            self.visible.append(txn_id)
            self.committed.add(txn_id)
        elif res.outcome is EndOutcome.DROPPED:
            self.ended_other.add(txn_id)
        elif res.outcome is EndOutcome.CONFLICT:
            assert resolution is Resolution.COMMIT or txn_id in self.committed
            assert res.error() is not None

    @rule(target=txns)
    def half(self) -> str:
        txn_id = f"t{self.n}"
        self.n += 1
        for b in (self.leader, self.follower):
            b.apply_half(txn_id, "pg", "c0", ref(self.n), self.now)
        self.stored_at[txn_id] = self.now
        return txn_id

    @rule(txn_id=txns, resolution=st.sampled_from(Resolution))
    def end(self, txn_id: str, resolution: Resolution) -> None:
        self._apply_end(txn_id, resolution)

    @rule(resolution=st.sampled_from(Resolution))
    def end_unknown_id(self, resolution: Resolution) -> None:
        res = self.leader.apply_end("never-stored", resolution, self.now)
        assert isinstance(res.error(), TransactionNotFoundError)

    @rule(client=st.sampled_from(["c0", "c1", "c2"]), up=st.booleans())
    def producers(self, client: str, up: bool) -> None:
        if up:
            self.leader.producer_up("pg", client)
        else:
            self.leader.producer_down("pg", client)

    @rule(dt=st.integers(0, 80), answers=st.lists(st.sampled_from(Resolution), max_size=4))
    def tick(self, dt: int, answers: list[Resolution]) -> None:
        self.now += dt
        for action in self.leader.due_checks(self.now, limit=5):
            txn = self.leader.get(action.txn_id)
            assert txn is not None and txn.state is TxnState.HALF
            assert self.now >= self.stored_at[action.txn_id] + 100, "no check before timeout"
            if isinstance(action, MoveAction):
                assert txn.checks == 3
                moved = self.leader.apply_moved(action.txn_id, self.now)
                assert moved == self.follower.apply_moved(action.txn_id, self.now)
                self.ended_other.add(action.txn_id)
                continue
            assert action.client is None or action.client in self.leader.live_producers("pg")
            sent = self.leader.apply_check_sent(action.txn_id, self.now, action.client)
            assert sent == self.follower.apply_check_sent(action.txn_id, self.now, action.client)
            if answers and action.client is not None:
                self._apply_end(action.txn_id, answers.pop(), from_check=True)

    @rule()
    def leader_change(self) -> None:
        self.leader.lost_leadership()

    @invariant()
    def only_committed_are_visible_and_once(self) -> None:
        assert len(self.visible) == len(set(self.visible)), "visible exactly once"
        assert set(self.visible) == self.committed
        assert not (self.committed & self.ended_other)
        for txn_id in self.visible:
            assert self.leader.state(txn_id) in (TxnState.COMMITTED, None)
        assert self.leader.open_count == self.follower.open_count

    @invariant()
    def halves_are_never_visible(self) -> None:
        for txn_id in self.stored_at:
            if self.leader.state(txn_id) is TxnState.HALF:
                assert txn_id not in self.visible


TestTransactionMachine = TransactionMachine.TestCase
TestTransactionMachine.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)
