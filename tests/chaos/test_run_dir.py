"""A run starts from an empty directory: an earlier run's cluster data would hand the new
cluster a topic full of messages with the same ids (found when `make chaos-full` ran twice in one
checkout: every scenario, baseline included, reported duplicates and reorders)."""

from __future__ import annotations

from pathlib import Path

from chaos.runner import RUN_OUTPUTS, fresh_run_dir


def test_an_earlier_runs_outputs_are_removed_and_nothing_else(tmp_path: Path) -> None:
    out = tmp_path / "leader-kill-seed1"
    (out / "data" / "broker-a-n0").mkdir(parents=True)
    (out / "data" / "broker-a-n0" / "data.mdb").write_bytes(b"old log")
    for name in RUN_OUTPUTS[1:]:
        (out / name).write_text("old")
    (out / "notes.txt").write_text("mine")
    fresh_run_dir(out)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    assert (out / "notes.txt").read_text() == "mine"


def test_a_new_directory_is_made(tmp_path: Path) -> None:
    out = tmp_path / "a" / "b"
    fresh_run_dir(out)
    assert out.is_dir() and not any(out.iterdir())
