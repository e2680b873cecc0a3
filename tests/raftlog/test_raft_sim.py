"""The Raft core under the deterministic simulator (raft_sim.py): 10 000 seeded schedules of faults
on groups of three and five must keep every safety invariant and end in a commit once healed; and
the simulator must catch each of three known Raft bugs put into the core or its shell.

Replay one seed: RAFT_SIM_SEED=123 .venv/bin/pytest tests/raftlog/test_raft_sim.py
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections import Counter

import pytest

from raftmq.raftlog.election import LogPosition, PreVoteReply, PreVoteRequest
from raftmq.raftlog.raft_core import RaftCore
from raftmq.raftlog.raft_messages import Message, RequestVote, VoteResponse
from tests.raftlog.raft_sim import SAFETY_KINDS, SimSettings, Simulation, Violation, find_violation

MUTANT_SEED_BUDGET = 1500  # each removed rule must be caught within this many seeds


def seeds(first: int, count: int) -> range:
    """RAFT_SIM_SEED replays one seed; RAFT_SIM_SEEDS changes how many run."""
    one = os.environ.get("RAFT_SIM_SEED")
    if one is not None:
        return range(int(one), int(one) + 1)
    return range(first, first + int(os.environ.get("RAFT_SIM_SEEDS", count)))


def sweep(first: int, count: int, settings: SimSettings) -> Counter[str]:
    """Run the seeds; the first failure fails the test with its seed and schedule."""
    totals: Counter[str] = Counter()
    started = time.process_time()
    for seed in seeds(first, count):
        sim = Simulation(seed, settings)
        sim.run()  # raises Violation naming the seed, the schedule and how to replay it
        totals.update(sim.stats)
        totals["leaders"] += len(sim.leaders)
        totals["max_liveness_ticks"] = max(
            totals["max_liveness_ticks"], sim.stats["liveness_ticks"]
        )
    totals["schedules"] = len(seeds(first, count))
    print(f"{settings}: {dict(totals)} in {time.process_time() - started:.1f} s of CPU")
    return totals


@pytest.mark.parametrize("first", [0, 3000])  # two halves: each well inside pytest's timeout
def test_three_nodes_stay_safe_and_live_under_faults(first: int) -> None:
    totals = sweep(first, 3000, SimSettings(nodes=3))
    if totals["schedules"] > 1:
        # The faults did happen: otherwise "no violation" would say nothing.
        assert totals["leaders"] > 1.5 * totals["schedules"]
        assert totals["crash_torn"] > 0 and totals["crash_meta"] > 0
        assert totals["crash_in_write"] > 0 and totals["isolated_new_leader"] > 0
        assert totals["acknowledged"] > totals["schedules"]
        assert totals["transfer_campaigns"] > 0


def test_five_nodes_stay_safe_and_live_under_faults() -> None:
    totals = sweep(0, 2000, SimSettings(nodes=5, events=50))
    if totals["schedules"] > 1:
        assert totals["leaders"] > 1.5 * totals["schedules"]
        assert totals["acknowledged"] > totals["schedules"]


def test_retention_cuts_and_transfers_stay_safe() -> None:
    """Compaction often, so followers behind the cut are caught up by snapshot; transfers often."""
    totals = sweep(0, 2000, SimSettings(nodes=3, compact_weight=8, transfer_weight=6))
    if totals["schedules"] > 1:
        assert totals["snapshots_installed"] > 0
        assert totals["transfer_campaigns"] > 0


# ---- the simulator catches bugs -------------------------------------------------------------


class CommitsAnyTerm(RaftCore):
    """Bug (a): a leader commits whatever a majority stores, of any term (Raft figure 8)."""

    def _may_commit(self, index: int) -> bool:
        return True


class VotesForAnyLog(RaftCore):
    """Bug (b): no up-to-date check on the candidate's log. PreVote repeats the check (it is
    the first gate), so it is removed there too: removing one leaves the other as a guard."""

    def _candidate_log_ok(self, candidate: LogPosition) -> bool:
        return True

    def _grant_pre_vote(self, req: PreVoteRequest) -> PreVoteReply:
        top = LogPosition(1 << 62, 1 << 62)  # every voter's log looks older than this
        return super()._grant_pre_vote(dataclasses.replace(req, log=top))


def votes_leave_early(m: Message) -> bool:
    """Bug (c): the shell sends ballots and votes before the Ready's hard state is durable."""
    return isinstance(m, RequestVote | VoteResponse)


def assert_caught(found: tuple[int, Violation] | None, bug: str) -> Violation:
    assert found is not None, f"{MUTANT_SEED_BUDGET} schedules did not catch {bug}"
    seed, violation = found
    assert violation.kind in SAFETY_KINDS, violation
    assert f"seed={seed}" in str(violation) and "schedule: [" in str(violation)
    print(f"{bug}: seed {seed}: {violation.kind}: {violation.detail.splitlines()[0]}")
    return violation


def test_catches_a_leader_committing_an_older_terms_entry() -> None:
    found = find_violation(range(MUTANT_SEED_BUDGET), core_factory=CommitsAnyTerm)
    assert_caught(found, "commit of an older term's entry by counting replicas")


def test_catches_a_vote_without_the_log_check() -> None:
    found = find_violation(range(MUTANT_SEED_BUDGET), core_factory=VotesForAnyLog)
    assert_caught(found, "votes without the up-to-date log check")


def test_catches_a_vote_sent_before_it_is_durable() -> None:
    """With the contract check off, a crash between sending a vote and persisting it lets the
    node vote twice in one term: two leaders."""
    found = find_violation(
        range(MUTANT_SEED_BUDGET), send_early=votes_leave_early, check_contract=False
    )
    assert_caught(found, "votes sent before the vote is durable")


def test_the_contract_check_names_a_shell_sending_before_persisting() -> None:
    found = find_violation(range(20), send_early=votes_leave_early)
    assert found is not None
    assert found[1].kind == "contract"


def test_a_failing_seed_replays_exactly() -> None:
    found = find_violation(range(MUTANT_SEED_BUDGET), core_factory=VotesForAnyLog)
    assert found is not None
    seed, first = found
    with pytest.raises(Violation) as again:
        Simulation(seed, core_factory=VotesForAnyLog).run()
    assert str(again.value) == str(first)


def test_a_passing_seed_replays_exactly() -> None:
    def trace(seed: int) -> tuple[object, ...]:
        sim = Simulation(seed, SimSettings(nodes=5))
        sim.run()
        disks = {i: (n.disk.hard_state, n.disk.entries) for i, n in sim.nodes.items()}
        return sim.now, sim.leaders, sim.acked, disks

    assert trace(11) == trace(11)
    assert trace(11) != trace(12)
