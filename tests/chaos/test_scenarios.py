"""The scenario schedules: deterministic per seed, every fault inside the produce window with
time left to recover, the CI set the one the issue names, and clear errors for bad input."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftmq.chaos.scenarios import RECOVERY_S, SCENARIOS, WARMUP_S, Kind, by_name, ci_set


def test_ci_set_is_the_six_leader_faults() -> None:
    kinds = {s.name: s.schedule(1).faults[0].kind for s in ci_set()}
    assert kinds == {
        "leader-kill": Kind.KILL,
        "leader-crash": Kind.CRASH,
        "leader-isolate": Kind.ISOLATE,
        "minority-partition": Kind.SPLIT,
        "leader-one-way": Kind.ONE_WAY_OUT,
        "leader-pause": Kind.PAUSE,
    }
    assert all(
        f.target == "leader" and f.majority_remains for s in ci_set() for f in s.schedule(1).faults
    )


def test_full_list_has_about_thirteen_and_unique_names() -> None:
    names = [s.name for s in SCENARIOS]
    assert len(names) == len(set(names)) >= 13


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32), duration=st.floats(20.0, 300.0), index=st.integers(0, 100))
def test_schedules_fit_the_window_and_repeat_per_seed(
    seed: int, duration: float, index: int
) -> None:
    scenario = SCENARIOS[index % len(SCENARIOS)]
    a = scenario.schedule(seed, duration)
    assert a == scenario.schedule(seed, duration)
    for f in a.faults:
        assert f.start_s >= WARMUP_S and f.length_s > 0
        assert f.end_s <= duration - RECOVERY_S + 1e-9
    # One fault at a time: each window has one cause, so failover times are attributable.
    ordered = sorted(a.faults, key=lambda f: f.start_s)
    for x, y in itertools.pairwise(ordered):
        assert x.end_s <= y.start_s


def test_random_mix_differs_between_seeds() -> None:
    s = by_name("random-mix")
    assert s.schedule(1).faults != s.schedule(2).faults
    assert len(s.schedule(1).faults) >= 3


def test_errors_name_what_to_do() -> None:
    with pytest.raises(KeyError, match="raftmq chaos list"):
        by_name("no-such")
    with pytest.raises(ValueError, match="at least"):
        by_name("leader-kill").schedule(1, 5.0)
