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
# The package's sources as the build sees them: raftmq/raftlog, a link to raftlog/ in a checkout
# and the folder itself in an sdist.
SOURCES = ROOT / "raftmq" / "raftlog"


def _compiled_list() -> Any:
    """raftlog/compiled.py alone (the standard library only): the one list of the modules."""
    spec = importlib.util.spec_from_file_location("_raftlog_compiled", SOURCES / "compiled.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


COMPILED = _compiled_list()


# mypy's settings for the compile (make types checks the code with pyproject.toml's, strict): an
# isolated build (pip's default) has mypy and setuptools only, not the stubs and packages the rest
# of raftmq imports, which mypy follows from raftmq/__init__.py; their errors are silenced, stubs'
# too (a config-file-only setting), and the missing ones read as Any.
_MYPY_CONFIG = """[mypy]
follow_imports = silent
follow_imports_for_stubs = True
ignore_missing_imports = True
"""


def _mypyc_extensions() -> list[Extension]:
    if os.environ.get(COMPILED.NO_EXTENSIONS_ENV, "") not in ("", "0"):
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        print("raftmq: mypyc is not installed; the Raft core runs from source", file=sys.stderr)
        return []
    files = [f"raftmq/raftlog/{m}.py" for m in COMPILED.COMPILED_MODULES]
    try:
        config = ROOT / "build" / "mypyc-mypy.ini"
        config.parent.mkdir(exist_ok=True)
        config.write_text(_MYPY_CONFIG)
        # The group's shared library is a module of the package (raftmq/raftlog/core__mypyc),
        # so it is found wherever raftmq is, not only from the checkout's root.
        exts: list[Extension] = mypycify(
            [*files, "--config-file", str(config)], opt_level="3", group_name="raftmq.raftlog.core"
        )
    except (Exception, SystemExit) as exc:  # a type error or a toolchain problem: no speed-up
        print(f"raftmq: mypyc failed ({exc!r}); the Raft core runs from source", file=sys.stderr)
        return []
    for ext in exts:
        ext.optional = True  # no compiler: the source runs, as for the codec
    return exts


class BuildExt(build_ext):
    """build_ext, then the manifest of the compiled modules' sources beside them."""

    def run(self) -> None:
        super().run()
        out = SOURCES if self.inplace else Path(self.build_lib) / "raftmq" / "raftlog"
        if out.is_dir():
            COMPILED.write_manifest(out, SOURCES)


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
