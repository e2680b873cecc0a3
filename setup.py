"""The optional C extension of the v2 stored batch codec (common/_stored_batch_c.c); everything
else is in pyproject.toml. `optional=True`: on a machine without a compiler or the Python headers
the build warns and leaves the extension out, and raftmq runs on the pure-Python twin."""

from __future__ import annotations

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "raftmq.common._stored_batch_c",
            sources=["common/_stored_batch_c.c"],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=True,
        )
    ],
)
