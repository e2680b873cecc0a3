"""Which of raftlog's modules run compiled, and the way back to their source.

The Raft core's per-entry Python (the core, its messages, the append and election rules, the
wire codec) is compiled by mypyc when raftmq is built (setup.py): from these same sources,
already checked by mypy --strict, so the pure-Python twin is the source itself and one test suite
runs against both (tests/raftlog/test_compiled.py). A compiled module shadows its .py once built
(Python's import system prefers an extension module), which would make an edited source do
nothing until the next build; so the build writes a manifest of the sources' hashes, and the
compiled modules are used only while every source still matches it and RAFTMQ_NO_EXTENSIONS is
not set. Otherwise all of them load from source together: compiled modules call each other
directly, so the group is one choice. Standard library only (setup.py loads this file alone).
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType

PACKAGE = "raftmq.raftlog"
# Leaves first: each compiled module imports only earlier ones of this list.
COMPILED_MODULES = ("raft_messages", "election", "replication", "raft_codec", "raft_core")
MANIFEST = "_mypyc_manifest.json"  # {module: sha256 of its source}, beside the built modules
NO_EXTENSIONS_ENV = "RAFTMQ_NO_EXTENSIONS"  # as common/stored_batch.py: "1" forces the source
COMPILED = "mypyc"
SOURCE = "python"


def source_hashes(directory: Path) -> dict[str, str]:
    """Each compiled module's source hash, as the build records it."""
    return {
        m: hashlib.sha256((directory / f"{m}.py").read_bytes()).hexdigest()
        for m in COMPILED_MODULES
    }


def write_manifest(directory: Path, sources: Path) -> None:
    """The build's step: record the hashes of `sources`' modules in `directory` (where the
    compiled modules were put)."""
    (directory / MANIFEST).write_text(json.dumps(source_hashes(sources), indent=1) + "\n")


def _built(directory: Path) -> bool:
    """Every module has an extension module beside its source."""
    suffixes = importlib.machinery.EXTENSION_SUFFIXES
    return all(any((directory / f"{m}{s}").exists() for s in suffixes) for m in COMPILED_MODULES)


def choose(directory: Path, environ: Mapping[str, str]) -> tuple[str, str]:
    """(COMPILED or SOURCE, why): what raftlog's compiled modules load from in `directory`."""
    if environ.get(NO_EXTENSIONS_ENV, "") not in ("", "0"):
        return SOURCE, f"{NO_EXTENSIONS_ENV} is set"
    if not _built(directory):
        return SOURCE, "not compiled (a build without mypyc or a C compiler)"
    try:
        recorded = json.loads((directory / MANIFEST).read_text())
        current = source_hashes(directory)
    except (OSError, ValueError) as exc:
        return SOURCE, f"no usable build manifest ({exc})"
    changed = sorted(m for m in COMPILED_MODULES if recorded.get(m) != current[m])
    if changed:
        return SOURCE, f"{', '.join(changed)} changed since the build (run make to rebuild)"
    return COMPILED, "built from these sources"


class _SourceFinder(importlib.abc.MetaPathFinder):
    """Finds the compiled modules' sources before the path finder finds their builds."""

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._names = {f"{PACKAGE}.{m}": m for m in COMPILED_MODULES}

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        module = self._names.get(fullname)
        if module is None:
            return None
        return importlib.util.spec_from_file_location(fullname, self._directory / f"{module}.py")


def install(directory: Path) -> tuple[str, str]:
    """Decide once per process, before any compiled module is imported; returns choose()'s."""
    kind, why = choose(directory, os.environ)
    if kind == SOURCE and _built(directory):
        sys.meta_path.insert(0, _SourceFinder(directory))
    return kind, why
