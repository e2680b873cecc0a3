"""The alarms' pure core (controller/alarms.py): rule parsing, and the pending -> firing ->
resolved state machine checked against a plain model on random observation sequences."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftmq.controller.alarms import AlarmBook, Kind, Rule, RuleError, State, parse_rules
from raftmq.controller.state import AlarmChange, CommandError, ControllerState, decode

# A value, None (the subject is gone) or UNKNOWN (there, but not measured this round).
UNKNOWN = -1
observations = st.lists(
    st.tuples(st.integers(0, 5_000), st.one_of(st.none(), st.just(UNKNOWN), st.integers(0, 20))),
    max_size=60,
)


def model(
    threshold: float, for_ms: int, seq: list[tuple[int, int | None]]
) -> list[tuple[str, int, int]]:
    """(status, at_ms, since_ms) the rule should give: a run of holding observations fires
    once at its first observation at least for_ms after the run began; it resolves at the
    first observation that does not hold (None: the subject is gone); UNKNOWN changes nothing."""
    out: list[tuple[str, int, int]] = []
    now, start, fired = 0, None, False
    for dt, value in seq:
        now += dt
        if value == UNKNOWN:
            continue
        if value is not None and value > threshold:
            if start is None:
                start, fired = now, False
            if not fired and now - start >= for_ms:
                out.append(("firing", now, start))
                fired = True
        else:
            if start is not None and fired:
                out.append(("resolved", now, start))
            start, fired = None, False
    return out


@given(observations, st.integers(0, 3), st.sampled_from([0, 1000, 4000]))
def test_state_machine_matches_the_model(
    seq: list[tuple[int, int | None]], threshold: int, for_ms: int
) -> None:
    book = AlarmBook((Rule(Kind.GROUP_LAG, float(threshold), for_ms),))
    got = []
    now = 0
    for dt, value in seq:
        now += dt
        seen: dict[str, float | None] = (
            {} if value is None else {"g/t": None if value == UNKNOWN else float(value)}
        )
        got += [(e.status, e.at_ms, e.since_ms) for e in book.evaluate(now, {Kind.GROUP_LAG: seen})]
    assert got == model(threshold, for_ms, seq)
    # Events alternate firing / resolved, sequence numbers increase, and what is still
    # firing is what the last event says.
    statuses = [s for s, _, _ in got]
    assert statuses == ["firing", "resolved"] * (len(statuses) // 2) + (
        ["firing"] if len(statuses) % 2 else []
    )
    seqs = [e.seq for e in book.events]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    firing = [a for a in book.active() if a.state is State.FIRING]
    assert len(firing) == (1 if statuses and statuses[-1] == "firing" else 0)


@given(st.lists(st.dictionaries(st.sampled_from("abcd"), st.integers(0, 5)), max_size=30))
def test_subjects_are_independent(rounds: list[dict[str, int]]) -> None:
    """Evaluating several subjects together gives each the events it gives alone."""
    rule = Rule(Kind.DISK_USED, 2.0, 0)
    together = AlarmBook((rule,))
    alone = {s: AlarmBook((rule,)) for s in "abcd"}
    got: list[tuple[str, str, int]] = []
    want: list[tuple[str, str, int]] = []
    for t, values in enumerate(rounds):
        obs = {s: float(v) for s, v in values.items()}
        got += [(e.subject, e.status, e.at_ms) for e in together.evaluate(t, {Kind.DISK_USED: obs})]
        for s, book in alone.items():
            one = {s: obs[s]} if s in obs else {}
            want += [
                (e.subject, e.status, e.at_ms) for e in book.evaluate(t, {Kind.DISK_USED: one})
            ]
    assert sorted(got) == sorted(want)


def test_unmeasured_kind_keeps_state_and_rule_subject_filters() -> None:
    book = AlarmBook(parse_rules("no_leader for 2s; group_lag[g/t] > 5"))
    assert book.evaluate(0, {Kind.NO_LEADER: {"b": 1.0}}) == []
    [e] = book.evaluate(2000, {Kind.NO_LEADER: {"b": 1.0}})
    assert (e.status, e.subject, e.rule) == ("firing", "b", "no_leader for 2s")
    assert book.evaluate(3000, {}) == []  # not measured this round: still firing
    assert book.evaluate(3000, {Kind.GROUP_LAG: {"other/t": 99.0}}) == []
    [e] = book.evaluate(3500, {Kind.GROUP_LAG: {"g/t": 6.0}})
    assert (e.status, e.subject) == ("firing", "g/t")
    [e] = book.evaluate(4000, {Kind.NO_LEADER: {"b": 0.0}})
    assert e.status == "resolved" and e.since_ms == 0 and e.value == 0.0


def test_dlq_growth_is_measured_over_its_window() -> None:
    book = AlarmBook(parse_rules("dlq_growth > 2 within 10s"))
    ev = []
    for t, total in ((0, 5), (4000, 6), (8000, 8), (9000, 9), (15000, 9), (20000, 9)):
        ev += [
            (e.status, e.at_ms, e.value) for e in book.evaluate(t, {Kind.DLQ_GROWTH: {"g": total}})
        ]
    # +3 within 8 s fires at 8 s; by 20 s the window (10..20 s) holds no growth: resolved.
    assert ev == [("firing", 8000, 3.0), ("resolved", 20000, 0.0)]


def test_dlq_growth_fires_for_a_groups_first_dead_letters() -> None:
    """Issue 26: %DLQ%g appears with its first dead letters; with no earlier sample its growth
    read 0 and 8 dead letters went unalerted. Totals there at the first round stay quiet."""
    book = AlarmBook(parse_rules("dlq_growth > 0 within 5m"))
    assert book.evaluate(0, {Kind.DLQ_GROWTH: {"old": 40.0}}) == []  # no known past
    assert book.evaluate(1000, {Kind.DLQ_GROWTH: {"old": 40.0}}) == []
    [e] = book.evaluate(2000, {Kind.DLQ_GROWTH: {"old": 40.0, "g": 8.0}})
    assert (e.status, e.subject, e.value) == ("firing", "g", 8.0)


def test_rules_parse_and_bad_rules_say_what_to_write() -> None:
    rules = parse_rules(
        "group_lag > 1000 for 1m; dlq_growth > 0 within 5m; no_leader for 30s;"
        " disk_used > 0.9 for 1m; follower_behind > 10000 for 30s; storage_error for 10s;"
        " retention_loss > 0"
    )
    assert [r.kind for r in rules] == list(Kind)
    assert rules[-2].name == "storage_error for 10s" and rules[-2].holds(1.0)
    assert not rules[-2].holds(0.0)
    assert rules[-1] == Rule(Kind.RETENTION_LOSS) and rules[-1].name == "retention_loss > 0"
    assert rules[0] == Rule(Kind.GROUP_LAG, 1000.0, 60_000)
    assert rules[1].within_ms == 300_000 and rules[2].threshold == 0.0
    assert [r.name for r in rules][:3] == [
        "group_lag > 1000 for 1m", "dlq_growth > 0 within 5m", "no_leader for 30s",
    ]  # fmt: skip
    assert parse_rules("") == ()
    for bad, words in (
        ("lag > 5", "unknown kind"),
        ("group_lag for 5s", "needs a threshold"),
        ("dlq_growth > 1", "needs a window"),
        ("group_lag > 5 within 5s", "only dlq_growth"),
        ("group_lag >> 5", "write KIND > N"),
    ):
        with pytest.raises(RuleError, match=words):
            parse_rules(bad)


def test_restored_firing_alarm_resolves_without_firing_again() -> None:
    book = AlarmBook(parse_rules("group_lag > 5 for 1s"))
    assert book.restore("group_lag > 5 for 1s", "g/t", 100, 9.0)
    assert not book.restore("gone > 1", "g/t", 100, 9.0)
    assert book.evaluate(5000, {Kind.GROUP_LAG: {"g/t": 50.0}}) == []
    [e] = book.evaluate(6000, {Kind.GROUP_LAG: {"g/t": 0.0}})
    assert (e.status, e.since_ms) == ("resolved", 100)


def test_alarm_changes_replicate_through_the_controller_state() -> None:
    state = ControllerState()
    fire = AlarmChange("firing", "no_leader for 2s", "broker-a", 100, 1.0)
    assert decode(fire.encode()) == fire
    assert state.apply(decode(fire.encode())).accepted
    assert list(state.firing.values()) == [fire]
    state.apply(decode(AlarmChange("resolved", fire.rule, fire.subject, 100, 0.0).encode()))
    assert state.firing == {}
    with pytest.raises(CommandError, match="firing or resolved"):
        decode(b'{"op":"alarm","status":"maybe","rule":"r","subject":"s","since_ms":1,"value":0}')


def test_retention_loss_is_observed_from_the_leaders_only_when_every_leader_answered() -> None:
    """The leaders' next_cut_losses become retention_loss values per group/topic (summed over
    broker groups); a group whose leader did not answer leaves the kind unmeasured."""
    from raftmq.common.pb import broker_pb2, common_pb2
    from raftmq.controller.alarm_service import observe

    def leader(*losses: tuple[str, str, int]) -> broker_pb2.BrokerStatus:
        return broker_pb2.BrokerStatus(
            role=common_pb2.LEADER,
            term=2,
            next_cut_losses=[broker_pb2.GroupLag(consumer_group=g, topic=t, lag=n)
                             for g, t, n in losses],
        )  # fmt: skip

    follower = broker_pb2.BrokerStatus(role=common_pb2.FOLLOWER, term=2)
    nodes = [("a", "n0"), ("a", "n1"), ("b", "n0")]
    got = observe(
        {Kind.RETENTION_LOSS},
        nodes,
        [leader(("g", "t", 4), ("h", "t", 1)), follower, leader(("g", "t", 3))],
    )
    assert got == {Kind.RETENTION_LOSS: {"g/t": 7.0, "h/t": 1.0}}
    assert observe({Kind.RETENTION_LOSS}, nodes, [leader(("g", "t", 4)), follower, None]) == {}
