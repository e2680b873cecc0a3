"""The history of a chaos run, Jepsen-shaped: send invokes and their completions, one op per
delivery, nemesis starts and stops, all timed by ONE monotonic clock. Plain values and a JSON
lines file; nothing here talks to a cluster or decides whether a run passed."""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast, get_args

OpType = Literal["invoke", "ok", "fail", "info"]
OpF = Literal[
    "send", "recv", "nemesis", "event"
]  # event: a lifecycle workload's note (a check-back)
Phase = Literal["start", "stop"]
OP_TYPES: tuple[str, ...] = get_args(OpType)
OP_FS: tuple[str, ...] = get_args(OpF)
PHASES: tuple[str, ...] = get_args(Phase)
FIELDS = ("time", "process", "type", "f", "value")

# A 60 s scenario at a few hundred ops/s is ~50k ops; this bound only stops a runaway recorder
# from eating the machine's memory before the run ends.
MAX_OPS = 5_000_000


@dataclass(frozen=True, slots=True)
class Op:
    """One history event.

    time: seconds of the harness's monotonic clock (time.monotonic(): CLOCK_MONOTONIC is shared
    by every process of the machine, so the workload's and the nemesis's times compare).
    type: `invoke` starts a send; `ok` = done (for a recv: one delivery); `fail` = definitely
    not stored; `info` = outcome unknown (timeout, lost connection); nemesis ops are `info`.
    value: send `{"id", "key"}` (+ `"queue"`, `"offset"` on ok when known); recv `{"id", "key",
    "queue", "offset"}`; nemesis `{"fault", "targets", "phase": "start"|"stop"}`. Ids are
    strings, unique per message; a send or recv without one is accepted and only counted by
    the checkers (chaos/checkers.py: anomalies).
    """

    time: float
    process: str
    type: OpType
    f: OpF
    value: dict[str, Any]

    def __post_init__(self) -> None:
        # The same checks guard the recorder (caller's bug) and the loader (bad file), so a
        # checker never meets an op it cannot interpret.
        if isinstance(self.time, bool) or not isinstance(self.time, int | float):
            raise ValueError(f"op time must be a number, not {self.time!r}")
        if not math.isfinite(self.time):
            raise ValueError(f"op time must be finite, not {self.time!r}")
        if type(self.time) is not float:
            # Equal ops compare equal whether made in a test (time=3) or loaded (3.0).
            object.__setattr__(self, "time", float(self.time))
        if not isinstance(self.process, str) or not self.process:
            raise ValueError(f"op process must be a non-empty string, not {self.process!r}")
        if self.type not in OP_TYPES:
            raise ValueError(f"op type must be one of {OP_TYPES}, not {self.type!r}")
        if self.f not in OP_FS:
            raise ValueError(f"op f must be one of {OP_FS}, not {self.f!r}")
        if not isinstance(self.value, dict):
            raise ValueError(f"op value must be an object, not {self.value!r}")
        if self.f == "nemesis":
            v = self.value
            if not isinstance(v.get("fault"), str) or v.get("phase") not in PHASES:
                raise ValueError(f"a nemesis op needs a fault name and a phase in {PHASES}: {v}")
            targets = v.get("targets", [])
            if not isinstance(targets, list | tuple) or not all(
                isinstance(t, str) for t in targets
            ):
                raise ValueError(f"nemesis targets must be a list of strings: {v}")
        elif "id" in self.value and not isinstance(self.value["id"], str):
            # An op without an id is kept (the checkers count it as an anomaly); an id of
            # another type would silently never match its send or delivery.
            raise ValueError(f"a {self.f} op's id must be a string: {self.value}")

    @property
    def msg_id(self) -> str | None:
        """The message id of a send or recv op (None when the op has none)."""
        return cast("str | None", self.value.get("id"))

    def to_json(self) -> dict[str, Any]:
        return {
            "time": self.time,
            "process": self.process,
            "type": self.type,
            "f": self.f,
            "value": self.value,
        }

    @classmethod
    def from_json(cls, obj: object) -> Op:
        """The op of one decoded JSON line; ValueError says what is wrong with it."""
        if not isinstance(obj, dict):
            raise ValueError(f"an op must be a JSON object, not {type(obj).__name__}")
        missing = [repr(k) for k in FIELDS[:4] if k not in obj]
        if missing:
            raise ValueError(f"op without {', '.join(missing)}")
        unknown = sorted(set(obj) - set(FIELDS))
        if unknown:
            raise ValueError(f"op with unknown fields {', '.join(unknown)}")
        # "value" may be left out of a hand-written line: an op without one has an empty value.
        return cls(obj["time"], obj["process"], obj["type"], obj["f"], obj.get("value", {}))


@dataclass(frozen=True, slots=True)
class Window:
    """One fault, from its nemesis start to its stop; stop is None when the history has no stop
    for it (the fault was never healed while the history was recorded)."""

    fault: str
    targets: tuple[str, ...]
    start: float
    stop: float | None

    def end(self, default: float) -> float:
        """The stop, or `default` (usually the end of the history) for a window never healed."""
        return default if self.stop is None else self.stop

    def to_json(self) -> dict[str, Any]:
        return {
            "fault": self.fault,
            "targets": list(self.targets),
            "start": self.start,
            "stop": self.stop,
        }


class Recorder:
    """Thread-safe, append-only history. The clock is read under the lock, so ops come out in
    time order. Pass `clock` in tests to control the times."""

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, *, max_ops: int = MAX_OPS
    ) -> None:
        if max_ops <= 0:
            raise ValueError(f"max_ops must be positive, not {max_ops}")
        self._clock = clock
        self._max_ops = max_ops
        self._lock = threading.Lock()
        self._ops: list[Op] = []

    def record(self, process: str, type: OpType, f: OpF, value: dict[str, Any]) -> Op:
        """Appends one op timed now; the value is copied so later changes by the caller do not
        rewrite history."""
        with self._lock:
            if len(self._ops) >= self._max_ops:
                raise RuntimeError(f"history full: {self._max_ops} ops recorded")
            op = Op(self._clock(), process, type, f, dict(value))
            self._ops.append(op)
        return op

    def invoke(self, process: str, f: OpF, value: dict[str, Any]) -> Op:
        return self.record(process, "invoke", f, value)

    def ok(self, process: str, f: OpF, value: dict[str, Any]) -> Op:
        return self.record(process, "ok", f, value)

    def fail(self, process: str, f: OpF, value: dict[str, Any]) -> Op:
        return self.record(process, "fail", f, value)

    def info(self, process: str, f: OpF, value: dict[str, Any]) -> Op:
        return self.record(process, "info", f, value)

    def nemesis(self, fault: str, targets: Sequence[str], phase: Phase) -> Op:
        return self.record(
            "nemesis", "info", "nemesis", {"fault": fault, "targets": list(targets), "phase": phase}
        )

    @property
    def ops(self) -> list[Op]:
        """A copy: the caller may read it while other threads keep recording."""
        with self._lock:
            return list(self._ops)

    def __len__(self) -> int:
        with self._lock:
            return len(self._ops)

    def write_jsonl(self, path: Path) -> None:
        write_jsonl(path, self.ops)


def write_jsonl(path: Path, ops: Iterable[Op]) -> None:
    """One JSON object per line, keys time/process/type/f/value. Written to a temporary file
    and renamed, so a crash never leaves half a history under the final name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as out:
        for op in ops:
            out.write(json.dumps(op.to_json(), separators=(",", ":"), allow_nan=False))
            out.write("\n")
    tmp.replace(path)


def load_jsonl(path: Path) -> list[Op]:
    """The ops of a history file, in file order. Blank lines are skipped; any other line that is
    not a valid op raises ValueError naming the file and the line number."""
    ops: list[Op] = []
    with open(path, encoding="utf-8") as src:
        for n, line in enumerate(src, 1):
            if not line.strip():
                continue
            try:
                ops.append(Op.from_json(json.loads(line)))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{n}: not JSON ({exc.msg})") from None
            except (ValueError, TypeError) as exc:
                raise ValueError(f"{path}:{n}: {exc}") from None
    return ops


def merge(*histories: Iterable[Op]) -> list[Op]:
    """One history in time order. Ops with equal times keep their order: first by argument
    position, then by position within their history (sorted() is stable)."""
    return sorted((op for h in histories for op in h), key=lambda op: op.time)


def fault_windows(ops: Iterable[Op]) -> list[Window]:
    """Fault windows from nemesis ops, sorted by start time. Each stop closes the earliest open
    start of the same fault name (the targets are the start's: a stop may resolve them
    differently); a start without a stop gives a window with stop None. A stop without an open
    start is a harness bug and raises ValueError."""
    nemesis = sorted((op for op in ops if op.f == "nemesis"), key=lambda op: op.time)
    open_starts: dict[str, list[Op]] = {}
    windows: list[Window] = []
    for op in nemesis:
        fault = cast(str, op.value["fault"])
        if op.value["phase"] == "start":
            open_starts.setdefault(fault, []).append(op)
            continue
        pending = open_starts.get(fault)
        if not pending:
            raise ValueError(f"nemesis stop of {fault!r} at {op.time} without a start")
        start = pending.pop(0)
        windows.append(Window(fault, _targets(start), start.time, op.time))
    for pending in open_starts.values():
        windows.extend(
            Window(start.value["fault"], _targets(start), start.time, None) for start in pending
        )
    windows.sort(key=lambda w: w.start)
    return windows


def _targets(op: Op) -> tuple[str, ...]:
    return tuple(op.value.get("targets", ()))
