"""A chaos run's history, Jepsen-shaped: every send invoke and its completion (ok, fail =
definitely not stored, info = unknown), every delivery (one recv ok each) and every nemesis
start/stop, timed by ONE monotonic clock (CLOCK_MONOTONIC is shared by every process on the
machine, so the workload's and the harness's times compare). Plain values and files, no I/O
beyond reading and writing the history file."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

OpType = Literal["invoke", "ok", "fail", "info"]
OpF = Literal["send", "recv", "nemesis"]
OP_TYPES = ("invoke", "ok", "fail", "info")
OP_FS = ("send", "recv", "nemesis")


@dataclass(frozen=True, slots=True)
class Op:
    time: float  # seconds of time.monotonic()
    process: str  # "producer-0", "consumer-0", "nemesis", ...
    type: OpType
    f: OpF
    value: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "time": self.time,
            "process": self.process,
            "type": self.type,
            "f": self.f,
            "value": self.value,
        }


@dataclass(frozen=True, slots=True)
class Window:
    """A fault from its nemesis start to its stop (None: never healed within the history)."""

    fault: str
    targets: tuple[str, ...]
    start: float
    stop: float | None


class Recorder:
    """Thread-safe, append-only; bounded only by the run's length (a 60 s scenario at 60 ops/s
    is a few thousand ops)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._ops: list[Op] = []

    def record(self, process: str, type: OpType, f: OpF, value: dict[str, Any]) -> Op:
        with self._lock:
            # The time is taken under the lock, so the list is in time order.
            op = Op(self._clock(), process, type, f, dict(value))
            self._ops.append(op)
        return op

    @property
    def ops(self) -> list[Op]:
        with self._lock:
            return list(self._ops)

    def write_jsonl(self, path: Path) -> None:
        write_jsonl(path, self.ops)


def write_jsonl(path: Path, ops: Iterable[Op]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as out:
        for op in ops:
            out.write(json.dumps(op.to_json(), separators=(",", ":")) + "\n")
    tmp.replace(path)  # never a half-written history


def parse_op(obj: Any, where: str) -> Op:
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: an op must be a JSON object")
    try:
        t, process, type_, f, value = (
            obj["time"],
            obj["process"],
            obj["type"],
            obj["f"],
            obj.get("value", {}),
        )
    except KeyError as exc:
        raise ValueError(f"{where}: op without {exc.args[0]!r}") from None
    if not isinstance(t, int | float) or not isinstance(process, str):
        raise ValueError(f"{where}: time must be a number and process a string")
    if type_ not in OP_TYPES or f not in OP_FS or not isinstance(value, dict):
        raise ValueError(f"{where}: type must be one of {OP_TYPES}, f one of {OP_FS}")
    return Op(float(t), process, cast(OpType, type_), cast(OpF, f), value)


def load_jsonl(path: Path) -> list[Op]:
    ops = []
    with open(path) as src:
        for n, line in enumerate(src, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{n}: not JSON ({exc.msg})") from None
            ops.append(parse_op(obj, f"{path}:{n}"))
    return ops


def merge(*histories: Iterable[Op]) -> list[Op]:
    """One history in time order; ops with equal times keep their input order."""
    return sorted((op for h in histories for op in h), key=lambda op: op.time)


def fault_windows(ops: Iterable[Op]) -> list[Window]:
    """Nemesis start/stop pairs, matched by fault name in order of their starts."""
    open_: dict[str, list[tuple[tuple[str, ...], float]]] = {}
    done: list[Window] = []
    for op in ops:
        if op.f != "nemesis":
            continue
        name = str(op.value.get("fault", "?"))
        targets = tuple(str(t) for t in op.value.get("targets", ()))
        if op.value.get("phase") == "start":
            open_.setdefault(name, []).append((targets, op.time))
        elif op.value.get("phase") == "stop" and open_.get(name):
            tg, start = open_[name].pop(0)
            done.append(Window(name, tg, start, op.time))
    for name, rest in open_.items():
        done.extend(Window(name, tg, start, None) for tg, start in rest)
    return sorted(done, key=lambda w: w.start)
