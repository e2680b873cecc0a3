"""common/quota.py: clients whose requests are held until they owe nothing, driven by
Hypothesis with the clock passed in. A user moves at most its burst plus its rate over the time
until its last request was served; a user under its rate is never held; one user's traffic never
holds another's; and a user that keeps sending reaches its rate (no over-throttling)."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from raftmq.common.quota import ANONYMOUS, OTHER, ByteQuotas, Flow, QuotaTable, parse_user_rates

RATE = 10_000  # bytes per second: alice's produce quota
MAX_THROTTLE_MS = 30_000


class HonestClients(RuleBasedStateMachine):
    """alice (quota RATE) and bob (no quota) send whenever their previous answer is back."""

    def __init__(self) -> None:
        super().__init__()
        self.q = ByteQuotas(
            {Flow.PRODUCE: QuotaTable(0, {"alice": RATE})}, max_throttle_ms=MAX_THROTTLE_MS
        )
        self.now = 1_000_000
        self.start = self.now
        self.alice_free_at = self.now  # when alice's last answer leaves the server
        self.alice_bytes = 0
        self.served: list[tuple[int, int]] = []  # alice's requests: (when served, bytes)

    @rule(wait_ms=st.integers(0, 5_000), nbytes=st.integers(0, RATE * 20))
    def alice_sends(self, wait_ms: int, nbytes: int) -> None:
        self.now = max(self.now, self.alice_free_at) + wait_ms
        held = self.q.owed_ms(Flow.PRODUCE, "alice", self.now)
        assert 0 <= held <= MAX_THROTTLE_MS
        self.now += held  # the server holds the request until alice owes nothing
        assert self.q.owed_ms(Flow.PRODUCE, "alice", self.now) == 0
        # the bucket's bound, over every window that ends now: what was served in it before
        # fits the burst plus the rate over the window
        moved = 0
        for at, size in reversed(self.served):
            moved += size
            assert moved <= RATE + RATE * (self.now - at) / 1000 + 1, (moved, self.now - at)
        self.q.charge(Flow.PRODUCE, "alice", nbytes, self.now)
        self.served.append((self.now, nbytes))
        self.alice_bytes += nbytes
        self.alice_free_at = self.now

    @rule(wait_ms=st.integers(0, 5_000), nbytes=st.integers(0, RATE * 20))
    def bob_sends(self, wait_ms: int, nbytes: int) -> None:
        self.now += wait_ms
        assert self.q.owed_ms(Flow.PRODUCE, "bob", self.now) == 0
        assert self.q.charge(Flow.PRODUCE, "bob", nbytes, self.now) == 0

    @invariant()
    def usage_counts_bytes(self) -> None:
        usage = self.q.usage.get(("alice", Flow.PRODUCE))
        assert (usage.bytes if usage else 0) == self.alice_bytes


TestHonestClients = HonestClients.TestCase
TestHonestClients.settings = settings(max_examples=60, stateful_step_count=40)


def test_a_user_under_its_rate_is_never_held() -> None:
    q = ByteQuotas({Flow.CONSUME: QuotaTable(RATE)})
    now = 0
    for _ in range(1000):
        assert q.owed_ms(Flow.CONSUME, "carol", now) == 0
        assert q.charge(Flow.CONSUME, "carol", RATE // 10, now) == 0
        now += 100  # exactly the rate


def test_a_greedy_user_is_slowed_to_its_rate_and_no_lower() -> None:
    q = ByteQuotas({Flow.PRODUCE: QuotaTable(RATE)})
    now, moved = 0, 0
    while now < 60_000:  # one request at a time, each sent as the last answer leaves
        now += q.owed_ms(Flow.PRODUCE, "dave", now)
        q.charge(Flow.PRODUCE, "dave", 4_000, now)
        moved += 4_000
        now += 1  # 1 ms for the round trip
    rate = moved / (now / 1000)
    assert 0.95 * RATE <= rate <= RATE * 1.02 + RATE / 60  # the burst, spread over a minute


def test_what_a_request_owes_is_paid_by_the_next_ones_wait() -> None:
    q = ByteQuotas({Flow.PRODUCE: QuotaTable(RATE)}, burst_ms=1000)
    owed = [q.charge(Flow.PRODUCE, "erin", RATE // 2, 0) for _ in range(4)]
    assert owed == [0, 0, 500, 1000]
    assert q.owed_ms(Flow.PRODUCE, "erin", 600) == 400
    assert q.owed_ms(Flow.PRODUCE, "erin", 1000) == 0


def test_one_huge_request_is_held_at_most_the_cap() -> None:
    q = ByteQuotas({Flow.PRODUCE: QuotaTable(RATE)}, max_throttle_ms=2_000)
    assert q.charge(Flow.PRODUCE, "f", RATE * 100, 0) == 2_000
    assert q.owed_ms(Flow.PRODUCE, "f", 2_000) == 0  # the debt beyond the cap is forgiven


def test_a_user_override_of_zero_lifts_the_default_and_flows_are_separate() -> None:
    q = ByteQuotas({Flow.PRODUCE: QuotaTable(100, {"ops": 0})})
    assert q.charge(Flow.PRODUCE, "ops", 10**9, 0) == 0
    assert q.charge(Flow.CONSUME, ANONYMOUS, 10**9, 0) == 0  # no consume quota at all
    q.charge(Flow.PRODUCE, ANONYMOUS, 1_000, 0)
    assert q.owed_ms(Flow.PRODUCE, ANONYMOUS, 0) > 0  # the default applies to anonymous


def test_users_past_the_bound_share_one_bucket_and_idle_ones_are_forgotten() -> None:
    q = ByteQuotas({Flow.PRODUCE: QuotaTable(RATE)}, max_users=2)
    q.charge(Flow.PRODUCE, "a", RATE // 2, 0)  # refills in 500 ms
    q.charge(Flow.PRODUCE, "b", RATE * 5, 0)  # in debt for 4 s
    q.charge(Flow.PRODUCE, "c", 1, 10)  # neither is full again: c goes to the shared bucket
    assert ("c", Flow.PRODUCE) not in q.usage and (OTHER, Flow.PRODUCE) in q.usage
    q.charge(Flow.PRODUCE, "d", 1, 1_000)  # a is full again: forgotten, d takes its place
    assert ("a", Flow.PRODUCE) not in q.usage and ("d", Flow.PRODUCE) in q.usage
    assert ("b", Flow.PRODUCE) in q.usage  # still owes: kept
    assert len([k for k in q.usage if k[0] != OTHER]) <= 2


def test_parse_user_rates() -> None:
    assert parse_user_rates(" alice=10, bob=0 ,", "x") == {"alice": 10, "bob": 0}
    assert parse_user_rates("", "x") == {}
    for bad in ("alice", "alice=-1", "=5", "alice=1,alice=2", "alice=1k"):
        with pytest.raises(ValueError, match="quota_produce_by_user"):
            parse_user_rates(bad, "quota_produce_by_user")
