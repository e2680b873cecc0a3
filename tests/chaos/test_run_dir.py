"""A run starts from an empty directory: an earlier run's cluster data would hand the new
cluster a topic full of messages with the same ids (found when `make chaos-full` ran twice in one
checkout: every scenario, baseline included, reported duplicates and reorders)."""

from __future__ import annotations

from pathlib import Path

from raftmq.chaos.runner import RunPaths


def test_an_earlier_runs_outputs_are_removed_and_nothing_else(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path / "leader-kill-seed1")
    (paths.data / "broker-a-n0").mkdir(parents=True)
    (paths.data / "broker-a-n0" / "data.mdb").write_bytes(b"old log")
    (paths.certs).mkdir()
    (paths.certs / "ca.crt").write_text("an earlier run's CA")
    files = [p for p in paths.outputs() if p not in (paths.data, paths.certs)]
    for path in files:
        path.write_text("old")
    (paths.out_dir / "notes.txt").write_text("mine")
    assert len(files) == 5
    paths.fresh()
    assert sorted(p.name for p in paths.out_dir.iterdir()) == ["notes.txt"]
    assert (paths.out_dir / "notes.txt").read_text() == "mine"


def test_a_new_directory_is_made(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path / "a" / "b")
    paths.fresh()
    assert paths.out_dir.is_dir() and not any(paths.out_dir.iterdir())
