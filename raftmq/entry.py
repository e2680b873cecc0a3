"""The console scripts' first step (`raftmq`, `raftmq-broker`, ...): import the command's module
and run its main; when an optional extra is not installed, one line says which to install
instead of a traceback. It must import nothing beyond the standard library."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable

# The top-level module each extra brings (pyproject.toml's optional-dependencies).
EXTRA_OF_MODULE = {
    "rich": "cli",
    "pysyncobj": "server",
    "lmdb": "server",
    "cryptography": "server",
    "uvloop": "server",
    "prometheus_client": "server",
    "matplotlib": "plot",
}


def _run(command: str, module: str, extras: str) -> None:
    try:
        main: Callable[[], int | None] = importlib.import_module(module).main
    except ModuleNotFoundError as exc:
        top = (exc.name or "").partition(".")[0]
        extra = EXTRA_OF_MODULE.get(top)
        if extra is None:
            raise  # not an extra's module: a broken install, let it be seen
        sys.stderr.write(
            f"{command}: needs the {extra!r} extra, which is not installed (no module {top!r}); "
            f"install it with: pip install 'raftmq[{extras}]'\n"
        )
        sys.exit(1)
    sys.exit(main())


def cli() -> None:
    _run("raftmq", "raftmq.ops.cli", "cli")


def broker() -> None:
    _run("raftmq-broker", "raftmq.broker.server", "server")


def namesrv() -> None:
    _run("raftmq-namesrv", "raftmq.namesrv.server", "server")


def controller() -> None:
    _run("raftmq-controller", "raftmq.controller.server", "server")


def proxy() -> None:
    _run("raftmq-proxy", "raftmq.proxy.server", "server")
