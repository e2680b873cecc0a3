"""How a role process runs, the same for the NameServer, the controller and the broker (RocketMQ's
srvutil): flags and settings, logging, SIGTERM/SIGINT handlers, then the role's own serve loop.

Stdlib only. It owns no threads; a role's serve function gets a stop Event and returns an exit
code. Settings errors are one line on stderr and exit 2, never a traceback.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Protocol, TypeVar

from raftmq.common import tls
from raftmq.common.log_text import configure_logging
from raftmq.common.malloc_policy import keep_freed_memory
from raftmq.common.settings import SettingsError, add_settings_flags, flag_overrides

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@dataclass(frozen=True, slots=True)
class SettingsSection:
    """One settings class a process takes flags for; flag_prefix for a role it embeds."""

    cls: type[Any]
    env_prefix: str
    flag_prefix: str = ""


def parse_role_args(
    prog: str,
    description: str,
    sections: Sequence[SettingsSection],
    argv: Sequence[str] | None,
) -> tuple[Path | None, list[dict[str, object]]]:
    """(--config file, the flags given for each section, in the order of `sections`)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help="TOML file; the section of each role below is read",
    )
    for s in sections:
        add_settings_flags(parser, s.cls, s.env_prefix, s.flag_prefix)
    # Every role takes --tls-* (the process's own identity, not a role's setting): installed
    # here, before the role builds any server or channel; a bad file is a SettingsError.
    add_settings_flags(parser, tls.TlsSettings, tls.ENV_PREFIX, "tls-")
    ns = parser.parse_args(argv)
    tls.install(tls.load(flag_overrides(ns, tls.TlsSettings, "tls-")))
    return ns.config, [flag_overrides(ns, s.cls, s.flag_prefix) for s in sections]


def parse_one_section(
    prog: str, description: str, section: SettingsSection, argv: Sequence[str] | None
) -> tuple[Path | None, dict[str, object]]:
    """(--config file, the flags given) of a process with one settings class."""
    config, (overrides,) = parse_role_args(prog, description, [section], argv)
    return config, overrides


class RoleSettings(Protocol):
    @property
    def log_level(self) -> str: ...


S = TypeVar("S", bound=RoleSettings)


def install_stop_handlers(stop: threading.Event, log: logging.Logger, role: str) -> None:
    """SIGTERM and SIGINT set `stop`. Installed explicitly for both: Python installs no SIGINT
    handler of its own when SIGINT starts ignored (`nohup cmd &`), and the process must still
    stop on it. Call from the main thread."""

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("%s.signal signal=%s", role, signal.Signals(signum).name)
        stop.set()

    for sig in STOP_SIGNALS:
        signal.signal(sig, on_signal)


def run_role(
    role: str,
    load: Callable[[], S],
    serve: Callable[[S, threading.Event], int],
) -> int:
    """The whole life of a role process: load its settings (flags parsed inside `load`), log
    to stderr at the settings' level, install the stop signals, serve; the exit code."""
    try:
        settings = load()
    except SettingsError as exc:
        print(f"{role}: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level.upper())
    # Buffers of the data path are freed and made again per request: keep their pages.
    if not keep_freed_memory():
        logging.getLogger(role).info("%s.malloc_policy unchanged (not glibc)", role)
    stop = threading.Event()
    install_stop_handlers(stop, logging.getLogger(role), role)
    return serve(settings, stop)
