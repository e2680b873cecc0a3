"""Alarms (issue 18 item 3), the pure core: rules parsed from the controller's `alarm_rules`
setting, and the per-(rule, subject) state machine that turns observed values into firing and
resolved events. No clock, no I/O: the shell (controller/alarm_service.py) polls the brokers and
the controller's own record, passes `now_ms` and the values, and logs and posts the events.

States: inactive -> pending (the condition holds) -> firing (it held for the rule's `for`) ->
inactive again, with a RESOLVED event, once it stops holding (or the subject is gone). A pending
alarm whose condition stops holding goes back to inactive silently. So each episode gives one
FIRING and one RESOLVED event, however often the condition is observed (deduplication).

Rule syntax, `;`-separated: `KIND > THRESHOLD for DURATION [within DURATION]`, e.g.
  group_lag > 1000 for 1m; dlq_growth > 0 within 5m; no_leader for 30s;
  disk_used > 0.9 for 1m; follower_behind > 10000 for 30s; retention_loss > 0
A rule may be limited to one subject with `[subject]`: `group_lag[orders] > 100 for 10s`.
"""

from __future__ import annotations

import enum
import re
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

MAX_RULES = 64
MAX_TRACKED = 100_000  # (rule, subject) pairs tracked at once; past it new subjects wait
MAX_EVENTS = 1_000  # recent events kept for `raftmq alerts`
MAX_SAMPLES = 1_000  # samples kept per subject of a windowed (dlq_growth) rule


class Kind(enum.Enum):
    GROUP_LAG = "group_lag"  # subject "group/topic": messages not yet consumed
    DLQ_GROWTH = "dlq_growth"  # subject "group": messages added to %DLQ%group within the window
    NO_LEADER = "no_leader"  # subject "broker group": 1 while no live leader is known
    DISK_USED = "disk_used"  # subject "broker group/node": used fraction of its disk (0..1)
    FOLLOWER_BEHIND = "follower_behind"  # subject "broker group/node": entries behind the leader
    STORAGE_ERROR = "storage_error"  # subject "broker group/node": 1 while writes fail or data rots
    # subject "group/topic": messages not consumed yet that the next retention cut deletes
    RETENTION_LOSS = "retention_loss"


DEFAULT_THRESHOLD = {Kind.NO_LEADER: 0.0, Kind.STORAGE_ERROR: 0.0}  # these need no "> N"
_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000}
_RULE = re.compile(
    r"^(?P<kind>[a-z_]+)(?:\[(?P<subject>[^\]]+)\])?"
    r"(?:\s*>\s*(?P<threshold>[0-9.]+))?"
    r"(?:\s+for\s+(?P<for>[0-9.]+(?:ms|s|m|h)))?"
    r"(?:\s+within\s+(?P<within>[0-9.]+(?:ms|s|m|h)))?$"
)


class RuleError(ValueError):
    """An alarm rule that does not parse; the message names the rule and the fix."""


@dataclass(frozen=True, slots=True)
class Rule:
    kind: Kind
    threshold: float = 0.0
    for_ms: int = 0
    within_ms: int = 0  # dlq_growth: the window the growth is measured over
    subject: str = ""  # "" = every subject

    @property
    def name(self) -> str:
        text = self.kind.value + (f"[{self.subject}]" if self.subject else "")
        if self.kind not in DEFAULT_THRESHOLD:
            text += f" > {self.threshold:g}"
        if self.for_ms:
            text += f" for {_duration_text(self.for_ms)}"
        if self.within_ms:
            text += f" within {_duration_text(self.within_ms)}"
        return text

    def holds(self, value: float) -> bool:
        return value > self.threshold


def _duration_text(ms: int) -> str:
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def _duration_ms(text: str) -> int:
    m = re.fullmatch(r"([0-9.]+)(ms|s|m|h)", text)
    assert m is not None  # the rule pattern only lets these through
    return int(float(m.group(1)) * _UNITS_MS[m.group(2)])


def parse_rules(text: str) -> tuple[Rule, ...]:
    rules = []
    for part in (p.strip() for p in text.split(";")):
        if not part:
            continue
        m = _RULE.match(re.sub(r"\s+", " ", part))
        kinds = ", ".join(k.value for k in Kind)
        if m is None:
            raise RuleError(
                f"alarm rule {part!r}: write KIND > N for DURATION (e.g. 'group_lag > 1000 "
                f"for 1m'); kinds: {kinds}"
            )
        try:
            kind = Kind(m.group("kind"))
        except ValueError:
            raise RuleError(f"alarm rule {part!r}: unknown kind; kinds: {kinds}") from None
        if m.group("threshold") is None and kind not in DEFAULT_THRESHOLD:
            raise RuleError(f"alarm rule {part!r}: {kind.value} needs a threshold ('> N')")
        within = _duration_ms(m.group("within")) if m.group("within") else 0
        if kind is Kind.DLQ_GROWTH and within <= 0:
            raise RuleError(f"alarm rule {part!r}: dlq_growth needs a window ('within 5m')")
        if kind is not Kind.DLQ_GROWTH and within:
            raise RuleError(f"alarm rule {part!r}: only dlq_growth takes 'within'")
        rules.append(
            Rule(
                kind,
                float(m.group("threshold") or DEFAULT_THRESHOLD.get(kind, 0.0)),
                _duration_ms(m.group("for")) if m.group("for") else 0,
                within,
                m.group("subject") or "",
            )
        )
    if len(rules) > MAX_RULES:
        raise RuleError(f"at most {MAX_RULES} alarm rules")
    return tuple(rules)


class State(enum.Enum):
    PENDING = "pending"
    FIRING = "firing"


@dataclass(frozen=True, slots=True)
class Event:
    seq: int  # increasing per book: the receiver's deduplication key together with `key`
    status: str  # "firing" or "resolved"
    rule: str
    subject: str
    value: float  # the value that fired (the last one seen, for a resolution)
    at_ms: int
    since_ms: int  # when the condition started to hold

    @property
    def key(self) -> str:
        return f"{self.rule}|{self.subject}|{self.since_ms}"


@dataclass(slots=True)
class _Track:
    state: State
    since_ms: int
    value: float


@dataclass(frozen=True, slots=True)
class Active:
    rule: str
    subject: str
    state: State
    since_ms: int
    value: float


@dataclass(slots=True)
class AlarmBook:
    rules: tuple[Rule, ...]
    _tracks: dict[tuple[int, str], _Track] = field(default_factory=dict)
    _samples: dict[tuple[int, str], deque[tuple[int, float]]] = field(default_factory=dict)
    _measured: set[int] = field(default_factory=set)  # windowed rules with a round behind them
    events: deque[Event] = field(default_factory=lambda: deque(maxlen=MAX_EVENTS))
    _seq: int = 0

    def evaluate(
        self, now_ms: int, observed: Mapping[Kind, Mapping[str, float | None]]
    ) -> list[Event]:
        """One round: `observed[kind][subject]` is the value seen now; None: the subject is
        there but could not be measured (a node that did not answer), its alarm stays as it is.
        A kind missing from `observed` was not measured at all: its alarms stay as they are. A
        subject missing from a measured kind is gone: its alarm resolves."""
        out: list[Event] = []
        for i, rule in enumerate(self.rules):
            values = observed.get(rule.kind)
            if values is None:
                continue
            if rule.subject:
                values = {s: v for s, v in values.items() if s == rule.subject}
            if rule.kind is Kind.DLQ_GROWTH:
                values = self._growth(i, rule, now_ms, values)
            for subject, value in values.items():
                if value is not None:
                    out += self._step(i, rule, subject, value, now_ms)
            for key in [k for k in self._tracks if k[0] == i and k[1] not in values]:
                out += self._clear(key, rule, now_ms)
        return out

    def _growth(
        self, i: int, rule: Rule, now_ms: int, totals: Mapping[str, float | None]
    ) -> dict[str, float | None]:
        """Messages added within the rule's window: the total now less the oldest sample kept
        inside the window. A subject that appears after the rule's first round (a group's
        %DLQ% topic, made by its first dead letter) grew from 0; one there at the first round
        has no known past (0 until a second sample exists), so a controller that just took
        over does not fire for old dead letters."""
        out: dict[str, float | None] = {}
        for subject, total in totals.items():
            if total is None:
                out[subject] = None
                continue
            samples = self._samples.get((i, subject))
            if samples is None:
                if len(self._samples) >= MAX_TRACKED:
                    continue
                samples = self._samples[(i, subject)] = deque(maxlen=MAX_SAMPLES)
                if i in self._measured:
                    samples.append((now_ms, 0.0))  # new since the last round: it started at 0
            samples.append((now_ms, total))
            while len(samples) > 1 and samples[1][0] <= now_ms - rule.within_ms:
                samples.popleft()
            out[subject] = max(0.0, total - samples[0][1])
        for key in [k for k in self._samples if k[0] == i and k[1] not in totals]:
            del self._samples[key]
        self._measured.add(i)
        return out

    def _step(self, i: int, rule: Rule, subject: str, value: float, now_ms: int) -> list[Event]:
        key = (i, subject)
        track = self._tracks.get(key)
        if not rule.holds(value):
            return self._clear(key, rule, now_ms, value) if track is not None else []
        if track is None:
            if len(self._tracks) >= MAX_TRACKED:
                return []
            track = self._tracks[key] = _Track(State.PENDING, now_ms, value)
        track.value = value
        if track.state is State.PENDING and now_ms - track.since_ms >= rule.for_ms:
            track.state = State.FIRING
            return [self._event("firing", rule, subject, value, now_ms, track.since_ms)]
        return []

    def _clear(
        self, key: tuple[int, str], rule: Rule, now_ms: int, value: float | None = None
    ) -> list[Event]:
        track = self._tracks.pop(key)
        if track.state is not State.FIRING:
            return []
        last = track.value if value is None else value
        return [self._event("resolved", rule, key[1], last, now_ms, track.since_ms)]

    def _event(
        self, status: str, rule: Rule, subject: str, value: float, now_ms: int, since_ms: int
    ) -> Event:
        self._seq += 1
        e = Event(self._seq, status, rule.name, subject, value, now_ms, since_ms)
        self.events.append(e)
        return e

    def restore(self, rule: str, subject: str, since_ms: int, value: float) -> bool:
        """Mark (rule, subject) as firing since `since_ms` without an event: what a new
        controller leader learns from the replicated record. False: no such rule (any more)."""
        for i, r in enumerate(self.rules):
            if r.name == rule:
                self._tracks[(i, subject)] = _Track(State.FIRING, since_ms, value)
                return True
        return False

    def active(self) -> list[Active]:
        return [
            Active(self.rules[i].name, subject, t.state, t.since_ms, t.value)
            for (i, subject), t in sorted(self._tracks.items())
        ]
