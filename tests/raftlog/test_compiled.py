"""The Raft core compiled by mypyc (raftlog/compiled.py): used where it was built from the
sources beside it, refused by RAFTMQ_NO_EXTENSIONS or by an edited source, and the core's own
tests run once more on the source (the rest of the suite runs on whichever the build made)."""

from __future__ import annotations

import importlib.machinery
import os
import subprocess
import sys
from pathlib import Path

import pytest

from raftmq import raftlog
from raftmq.raftlog import compiled
from raftmq.raftlog.compiled import COMPILED, COMPILED_MODULES, NO_EXTENSIONS_ENV, SOURCE
from tests.harness.procs import python_prints

ROOT = Path(__file__).resolve().parents[2]
NO_EXTENSIONS = os.environ.get(NO_EXTENSIONS_ENV, "") not in ("", "0")
SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


def _tree(tmp_path: Path, *, built: bool = True) -> Path:
    """A directory shaped like raftlog after a build: sources, modules, manifest."""
    for m in COMPILED_MODULES:
        (tmp_path / f"{m}.py").write_text(f"NAME = {m!r}\n")
        if built:
            (tmp_path / f"{m}{SUFFIX}").write_bytes(b"")
    compiled.write_manifest(tmp_path, tmp_path)
    return tmp_path


def test_a_build_of_these_sources_is_chosen(tmp_path: Path) -> None:
    assert compiled.choose(_tree(tmp_path), {}) == (COMPILED, "built from these sources")
    assert compiled.choose(tmp_path, {NO_EXTENSIONS_ENV: "0"})[0] == COMPILED


def test_the_environment_refuses_the_build(tmp_path: Path) -> None:
    assert compiled.choose(_tree(tmp_path), {NO_EXTENSIONS_ENV: "1"}) == (
        SOURCE,
        f"{NO_EXTENSIONS_ENV} is set",
    )


def test_an_edited_source_runs_from_source_until_rebuilt(tmp_path: Path) -> None:
    """Without this an extension module shadows its .py and an edit silently does nothing."""
    d = _tree(tmp_path)
    (d / "election.py").write_text("NAME = 'edited'\n")
    kind, why = compiled.choose(d, {})
    assert kind == SOURCE and "election changed since the build" in why, why


def test_no_build_or_no_manifest_is_the_source(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    kind, why = compiled.choose(_tree(tmp_path / "a", built=False), {})
    assert kind == SOURCE and why.startswith("not compiled"), why
    (tmp_path / "b").mkdir()
    d = _tree(tmp_path / "b")
    (d / compiled.MANIFEST).unlink()
    kind, why = compiled.choose(d, {})
    assert kind == SOURCE and "no usable build manifest" in why, why


def _implementation_in(env: dict[str, str]) -> list[str]:
    code = (
        "import raftmq.raftlog as r, raftmq.raftlog.raft_core as c; "
        "print(r.IMPLEMENTATION); print(c.__file__)"
    )
    return python_prints(code, env).split()


def test_the_core_runs_compiled_unless_the_environment_refuses_it() -> None:
    env = {k: v for k, v in os.environ.items() if k != NO_EXTENSIONS_ENV}
    kind, where = _implementation_in(env | {NO_EXTENSIONS_ENV: "1"})
    assert kind == SOURCE and where.endswith("raft_core.py"), where
    if NO_EXTENSIONS:
        assert raftlog.IMPLEMENTATION == SOURCE
        return
    if raftlog.IMPLEMENTATION != COMPILED:
        pytest.fail(
            f"the Raft core runs from source ({raftlog.IMPLEMENTATION_REASON}): run `make` "
            f"(setup.py build_ext --inplace; needs mypy and gcc), or set {NO_EXTENSIONS_ENV}=1 "
            "to test the source alone"
        )
    kind, where = _implementation_in(env)
    assert kind == COMPILED and where.endswith(SUFFIX), where


def test_the_cores_own_tests_pass_on_the_source_too() -> None:
    """The suite runs on the build; the core's tests once more on the twin, the source (the
    simulator with fewer schedules: the rules, not the search, are what differ)."""
    if NO_EXTENSIONS:
        pytest.skip("the whole run is on the source already")
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    env |= {NO_EXTENSIONS_ENV: "1", "RAFT_SIM_SEEDS": "300"}
    tests = [
        f"tests/raftlog/{name}.py"
        for name in ("test_raft_core", "test_raft_codec", "test_election", "test_replication",
                     "test_raft_sim")
    ]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", *tests],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
