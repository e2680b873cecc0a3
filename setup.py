"""raftmq's compiled parts; everything else is in pyproject.toml. Both are optional: on a machine
without a C compiler or the Python headers the build warns and leaves them out, and raftmq runs
on their pure-Python twins.

- The v2 stored batch codec's C extension (common/_stored_batch_c.c; its twin is
  common/_stored_batch_py.py).
- The Raft core's modules compiled by mypyc from their own sources (raftlog/compiled.py lists
  them and picks at import; the twin is the source). The build records the sources' hashes
  beside the compiled modules, so an edited source runs as source until the next build.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


def _compiled_list() -> Any:
    """raftlog/compiled.py alone (the standard library only): the one list of the modules."""
    spec = importlib.util.spec_from_file_location(
        "_raftlog_compiled", ROOT / "raftlog" / "compiled.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


COMPILED = _compiled_list()


def _mypyc_extensions() -> list[Extension]:
    if os.environ.get(COMPILED.NO_EXTENSIONS_ENV, "") not in ("", "0"):
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        print("raftmq: mypyc is not installed; the Raft core runs from source", file=sys.stderr)
        return []
    exts: list[Extension] = mypycify(
        [f"raftmq/raftlog/{m}.py" for m in COMPILED.COMPILED_MODULES], opt_level="3"
    )
    for ext in exts:
        ext.optional = True  # no compiler: the source runs, as for the codec
    return exts


class BuildExt(build_ext):  # type: ignore[misc]  # setuptools is untyped here
    """build_ext, then the manifest of the compiled modules' sources beside them."""

    def run(self) -> None:
        super().run()
        sources = ROOT / "raftlog"
        out = sources if self.inplace else Path(self.build_lib) / "raftmq" / "raftlog"
        if out.is_dir():
            COMPILED.write_manifest(out, sources)


setup(
    cmdclass={"build_ext": BuildExt},
    ext_modules=[
        Extension(
            "raftmq.common._stored_batch_c",
            sources=["common/_stored_batch_c.c"],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=True,
        ),
        *_mypyc_extensions(),
    ],
)
