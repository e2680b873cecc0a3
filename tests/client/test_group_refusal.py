"""A consumer's episodes of its group being refused (client/group_refusal.py), driven directly:
told once per episode, one probe per back-off period whatever the number of queues, the wait
bounded, and an answer to a pull sent before the episode never ending it (a property test over
random interleavings of pulls and answers)."""

from __future__ import annotations

import itertools

from hypothesis import example, given, settings
from hypothesis import strategies as st

from raftmq.client.group_refusal import FIRST_PROBE_S, MAX_PROBE_S, RECHECK_S, GroupRefusal
from raftmq.common.errors import ConsumeDisabledError

OFF = ConsumeDisabledError.for_group("g")


def test_one_probe_per_period_doubling_to_the_cap() -> None:
    r = GroupRefusal()
    assert r.pull_delay_s(0.0) == 0.0  # consuming: every queue pulls
    assert r.refused(OFF, sent_s=0.0, now_s=0.1) is True
    assert r.refused(OFF, sent_s=0.05, now_s=0.1) is False  # another queue's, same episode
    assert r.error is OFF
    assert 0 < r.pull_delay_s(0.2) <= RECHECK_S  # every queue waits for the probe
    probes = []  # ms
    for ms in range(200, 30_000):  # a queue asks every ms; each probe is refused 10 ms later
        if r.pull_delay_s(ms / 1000) == 0:
            probes.append(ms)
            r.refused(OFF, sent_s=ms / 1000, now_s=(ms + 10) / 1000)
    gaps = [b - a for a, b in itertools.pairwise(probes)]
    assert probes[0] == 100 + FIRST_PROBE_S * 1000
    assert gaps[:3] == [1010, 2010, 4010]  # doubled after each refused probe (+ its answer)
    assert set(gaps[3:]) == {MAX_PROBE_S * 1000 + 10}  # capped


def test_an_answer_to_a_pull_from_before_the_episode_does_not_end_it() -> None:
    r = GroupRefusal()
    r.refused(OFF, sent_s=10.0, now_s=10.2)
    assert r.served(sent_s=9.0) is None  # held since before the refusal: says nothing
    assert r.error is OFF
    assert r.served(sent_s=11.0) is OFF  # a probe served: consuming is on again
    assert r.error is None and r.pull_delay_s(11.1) == 0.0
    assert r.refused(OFF, sent_s=12.0, now_s=12.0) is True  # a new episode is told again


ops = st.lists(
    st.tuples(
        st.sampled_from(["pull", "refuse", "serve", "lost"]),
        st.floats(0.0, 2.0, allow_nan=False),
        st.integers(0, 7),
    ),
    max_size=120,
)


@settings(max_examples=300)
@given(ops=ops)
# A long poll sent before the refusal that began the episode, answered after it.
@example(ops=[("pull", 0.0, 0), ("pull", 1.0, 0), ("refuse", 0.0, 1), ("serve", 0.0, 0)])
def test_episodes_are_told_once_paced_and_end_only_by_a_later_pull(ops: list) -> None:
    r = GroupRefusal()
    now = 0.0
    in_flight: list[float] = []  # send times of pulls not answered yet
    started_at: float | None = None  # the refused pull that began the current episode
    grants: list[float] = []  # pulls let out during the current episode
    for op, dt, i in ops:
        now += dt
        if op == "pull":
            delay = r.pull_delay_s(now)
            assert 0 <= delay <= RECHECK_S
            if delay == 0:
                in_flight.append(now)
                if r.error is not None:
                    grants.append(now)
        elif in_flight:
            sent = in_flight.pop(i % len(in_flight))
            if op == "refuse":
                was = r.error
                assert r.refused(OFF, sent, now) is (was is None), "told once per episode"
                if was is None:
                    started_at, grants = sent, []
            elif op == "serve":
                before = r.error
                ended = r.served(sent)
                if before is not None and started_at is not None and sent < started_at:
                    assert ended is None and r.error is before, "an older answer ended it"
                elif before is not None:
                    assert ended is before and r.error is None
                    started_at = None
            # "lost": a timeout, neither refused nor served
        # In an episode the probes are at least FIRST_PROBE_S apart: one per period for the
        # whole consumer, however many queues ask.
        for a, b in itertools.pairwise(grants):
            assert b - a >= FIRST_PROBE_S - 1e-9
