"""What `raftmq cluster up` started, kept in <data_dir>/cluster-state.json so that
`raftmq cluster down` can stop exactly those processes: each child's pid with its start time
(so a reused pid is never taken for ours), its ports and its log, and the `up` process itself.

Values and a JSON round trip, plus an atomic write and a read that treats a missing or unreadable
file as "nothing recorded". Nothing here signals a process.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

STATE_FILE = "cluster-state.json"
FORMAT_VERSION = 1


@dataclass(frozen=True, slots=True)
class ProcessRecord:
    name: str
    role: str
    pid: int
    start_ticks: int  # /proc/<pid>/stat field 22
    ports: tuple[int, ...]
    log: str


@dataclass(frozen=True, slots=True)
class ClusterState:
    cluster: str
    spec: str  # the description `cluster up` was given, as typed (for the `down` hint)
    runner_pid: int
    runner_start_ticks: int
    detached: bool
    processes: tuple[ProcessRecord, ...]

    def holder_of(self, port: int) -> ProcessRecord | None:
        return next((p for p in self.processes if port in p.ports), None)


def state_path(data_dir: Path) -> Path:
    return data_dir / STATE_FILE


def to_json(state: ClusterState) -> str:
    return json.dumps(
        {
            "version": FORMAT_VERSION,
            "cluster": state.cluster,
            "spec": state.spec,
            "runner": {"pid": state.runner_pid, "start_ticks": state.runner_start_ticks},
            "detached": state.detached,
            "processes": [
                {
                    "name": p.name,
                    "role": p.role,
                    "pid": p.pid,
                    "start_ticks": p.start_ticks,
                    "ports": list(p.ports),
                    "log": p.log,
                }
                for p in state.processes
            ],
        },
        indent=2,
    )


def from_json(text: str) -> ClusterState:
    """The state in `text`; ValueError (KeyError, TypeError included) if it is not one."""
    raw = json.loads(text)
    if raw.get("version") != FORMAT_VERSION:
        raise ValueError(f"unknown state file version {raw.get('version')!r}")
    return ClusterState(
        cluster=str(raw["cluster"]),
        spec=str(raw["spec"]),
        runner_pid=int(raw["runner"]["pid"]),
        runner_start_ticks=int(raw["runner"]["start_ticks"]),
        detached=bool(raw["detached"]),
        processes=tuple(
            ProcessRecord(
                name=str(p["name"]),
                role=str(p["role"]),
                pid=int(p["pid"]),
                start_ticks=int(p["start_ticks"]),
                ports=tuple(int(x) for x in p["ports"]),
                log=str(p["log"]),
            )
            for p in raw["processes"]
        ),
    )


def write(path: Path, state: ClusterState) -> None:
    """Replace the file at once (write aside, then rename), so a reader never sees half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(to_json(state))
    os.replace(tmp, path)


def read(path: Path) -> ClusterState | None:
    """The recorded state, or None when there is none (or it cannot be read as one)."""
    try:
        return from_json(path.read_text())
    except (OSError, ValueError, KeyError, TypeError):  # missing, or not a state file
        return None


def remove(path: Path) -> None:
    path.unlink(missing_ok=True)
