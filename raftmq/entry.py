"""The console scripts' first step (`raftmq`, `raftmq-broker`, ...): import the command's module
and run its main; when an optional extra is not installed, one line says which to install
instead of a traceback. It must import nothing beyond the standard library."""

from __future__ import annotations

import importlib
import importlib.metadata
import re
import sys
from collections.abc import Callable

_EXTRA_MARKER = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")
_NAME_END = re.compile(r"[\s;<>=!~\[(]")


def extra_of(module: str) -> str | None:
    """The optional extra whose requirement installs top-level `module`, read from the installed
    package's metadata (pyproject.toml's optional-dependencies), so no second list can drift;
    None when no extra names it (then the install itself is broken). Assumes a distribution
    named like its module (`prometheus_client` is `prometheus-client`), true of ours."""
    try:
        requirements = importlib.metadata.requires("raftmq") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    want = module.replace("_", "-").lower()
    for req in requirements:
        name = _NAME_END.split(req, maxsplit=1)[0].replace("_", "-").lower()
        marker = _EXTRA_MARKER.search(req)
        if name == want and marker is not None:
            return marker.group(1)
    return None


def _run(command: str, module: str, extras: str) -> None:
    try:
        main: Callable[[], int | None] = importlib.import_module(module).main
    except ModuleNotFoundError as exc:
        top = (exc.name or "").partition(".")[0]
        extra = extra_of(top)
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
