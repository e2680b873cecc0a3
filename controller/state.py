"""The controller's replicated state as a pure state machine: role reports in, each group's
leader, term and epoch out. Every controller applies the same committed commands in the same
order and so holds the same records. No clock is read here: command times come in the command.

Fencing: a report with a term older than the group's recorded term is refused, and so is a
second leader for a term that already has one; the recorded term never decreases.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from raftmq.common.errors import InvalidArgumentError
from raftmq.controller.acl_state import AclCommand, AclState

MAX_GROUPS = 10_000
MAX_MEMBERS = 64
MAX_FIRING = 10_000  # firing alarms recorded (controller/alarm_service.py)


class CommandError(ValueError):
    """A command that does not decode or breaks a rule of its shape (every replica agrees)."""


@dataclass(frozen=True, slots=True)
class RoleReport:
    broker_group: str
    node_id: str
    address: str
    term: int
    leader: bool  # True: the node says it leads `term`; False: it follows
    now_ms: int

    def encode(self) -> bytes:
        return json.dumps(
            {
                "op": "report",
                "group": self.broker_group,
                "node": self.node_id,
                "address": self.address,
                "term": self.term,
                "leader": self.leader,
                "now_ms": self.now_ms,
            },
            separators=(",", ":"),
        ).encode()


@dataclass(frozen=True, slots=True)
class AlarmChange:
    """An alarm fired or resolved (issue 18): replicated so a new controller leader continues
    from the alarms that are firing instead of firing them again."""

    status: str  # "firing" or "resolved"
    rule: str
    subject: str
    since_ms: int
    value: float

    def encode(self) -> bytes:
        return json.dumps(
            {
                "op": "alarm",
                "status": self.status,
                "rule": self.rule,
                "subject": self.subject,
                "since_ms": self.since_ms,
                "value": self.value,
            },
            separators=(",", ":"),
        ).encode()


@dataclass(slots=True)
class GroupRecord:
    broker_group: str
    leader_node_id: str = ""
    term: int = 0
    epoch: int = 0
    changed_ms: int = 0
    members: dict[str, str] = field(default_factory=dict)

    @property
    def leader_address(self) -> str:
        return self.members.get(self.leader_node_id, "")


@dataclass(frozen=True, slots=True)
class Verdict:
    accepted: bool
    changed: bool  # the group's leader changed (push it to the NameServers)
    reason: str
    group: str
    leader_node_id: str
    term: int
    epoch: int


Command = RoleReport | AlarmChange | AclCommand


def decode(data: bytes) -> Command:
    try:
        raw: Any = json.loads(data)
        if raw.get("op") == "acl":
            return AclCommand.from_raw(raw)
        if raw.get("op") == "alarm":
            alarm = AlarmChange(
                str(raw["status"]),
                str(raw["rule"]),
                str(raw["subject"]),
                int(raw["since_ms"]),
                float(raw["value"]),
            )
            if alarm.status not in ("firing", "resolved"):
                raise CommandError(f"alarm status {alarm.status!r}: firing or resolved")
            return alarm
        if raw.get("op") != "report":
            raise CommandError(f"unknown controller command {raw.get('op')!r}")
        report = RoleReport(
            str(raw["group"]),
            str(raw["node"]),
            str(raw["address"]),
            int(raw["term"]),
            bool(raw["leader"]),
            int(raw["now_ms"]),
        )
    except InvalidArgumentError as exc:
        raise CommandError(f"invalid controller command: {exc.message}") from exc
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CommandError(f"undecodable controller command: {exc}") from exc
    if not report.broker_group or not report.node_id or report.term < 0:
        raise CommandError("a role report needs a group, a node id and a term >= 0")
    return report


class ControllerState:
    def __init__(self) -> None:
        self.groups: dict[str, GroupRecord] = {}
        # (rule, subject) -> the firing alarm's change (since_ms, value)
        self.firing: dict[tuple[str, str], AlarmChange] = {}
        self.acl = AclState()  # users and policies (issue 19)

    def unchanged_verdict(self, report: RoleReport) -> Verdict | None:
        """The verdict `apply(report)` would give if applying it changes nothing (a heartbeat's
        re-report: known member at the same address, a follower, a stale term or the leader
        already recorded), else None. The controller leader answers such reports without
        committing them, so heartbeats do not grow the log."""
        rec = self.groups.get(report.broker_group)
        if rec is None or rec.members.get(report.node_id) != report.address:
            return None
        if report.term < rec.term:
            return self._verdict(
                rec, False, False, f"stale term {report.term}: the group is at term {rec.term}"
            )
        if not report.leader:
            return self._verdict(rec, True, False, "follower noted")
        if report.term == rec.term and rec.leader_node_id == report.node_id:
            return self._verdict(rec, True, False, "already recorded")
        return None

    def apply(self, command: Command) -> Verdict:
        if isinstance(command, AlarmChange):
            return self._apply_alarm(command)
        if isinstance(command, AclCommand):
            accepted, reason = self.acl.apply(command)
            # an ACL verdict's epoch is the ACL version after it
            return Verdict(accepted, False, reason, "", "", 0, self.acl.version)
        report = command
        rec = self.groups.get(report.broker_group)
        if rec is None:
            if len(self.groups) >= MAX_GROUPS:
                return self._verdict(
                    GroupRecord(report.broker_group), False, False, "too many groups"
                )
            rec = self.groups[report.broker_group] = GroupRecord(report.broker_group)
        if report.node_id in rec.members or len(rec.members) < MAX_MEMBERS:
            rec.members[report.node_id] = report.address
        if report.term < rec.term:
            return self._verdict(
                rec, False, False, f"stale term {report.term}: the group is at term {rec.term}"
            )
        if not report.leader:
            return self._verdict(rec, True, False, "follower noted")
        if report.term == rec.term and rec.leader_node_id:
            if rec.leader_node_id == report.node_id:
                return self._verdict(rec, True, False, "already recorded")
            return self._verdict(
                rec,
                False,
                False,
                f"term {report.term} already has leader {rec.leader_node_id}",
            )
        rec.leader_node_id = report.node_id
        rec.term = report.term
        rec.epoch += 1
        rec.changed_ms = report.now_ms
        return self._verdict(rec, True, True, "leader changed")

    def _apply_alarm(self, a: AlarmChange) -> Verdict:
        key = (a.rule, a.subject)
        accepted = True
        if a.status == "resolved":
            self.firing.pop(key, None)
        elif key in self.firing or len(self.firing) < MAX_FIRING:
            self.firing[key] = a
        else:
            accepted = False
        return Verdict(accepted, False, f"alarm {a.status}", "", "", 0, 0)

    @staticmethod
    def _verdict(rec: GroupRecord, accepted: bool, changed: bool, reason: str) -> Verdict:
        return Verdict(
            accepted, changed, reason, rec.broker_group, rec.leader_node_id, rec.term, rec.epoch
        )
