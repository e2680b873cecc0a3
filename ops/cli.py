"""The `raftmq` command: the top-level parser and error handling. Subcommand groups are found
through the `raftmq.cli` entry points (modules exposing `register(subparsers)`), so the chaos
suite plugs in from above without this module importing it; a group whose extra is not installed
is left out. Each handler returns an exit code. A typed raftmq error (or an OSError) is printed
as one red line (exit 1), never as a traceback."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import re
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points
from typing import NoReturn

import raftmq
from raftmq.common import tls
from raftmq.common.auth import (
    ENV_ACCESS_KEY,
    ENV_CREDENTIALS_FILE,
    ENV_SECRET_KEY,
    load_credentials,
)
from raftmq.common.errors import RaftMQError
from raftmq.common.log_text import configure_logging, printable
from raftmq.common.settings import SettingsError
from raftmq.ops.cluster_spec import SpecError
from raftmq.ops.terminal_text import literal, make_console

ENTRY_POINT_GROUP = "raftmq.cli"
DEFAULT_NAMESRV = "127.0.0.1:9876,127.0.0.1:9877"
# Options whose value may be a relative time such as -10m, which argparse would take for a flag
# (`message list --from -10m`, `stats topic T --since -1h`, `group reset --to-time -2h`).
RELATIVE_TIME_OPTIONS = frozenset({"--to-time", "--from", "--to", "--since", "--until", "--before"})
_RELATIVE_TIME = re.compile(r"-\d+[smhd]")

log = logging.getLogger("raftmq.cli")
err_console = make_console(stderr=True)


def subcommand_modules() -> list[str]:
    """The modules of the installed `raftmq.cli` entry points, in name order."""
    found = entry_points(group=ENTRY_POINT_GROUP)
    return [ep.value for ep in sorted(found, key=lambda ep: ep.name)]


class OneLineParser(argparse.ArgumentParser):
    """argparse with its usage errors on one line (the usage itself is one `--help` away);
    subparsers inherit the class."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {printable(message)} (see `{self.prog} --help`)\n")
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="raftmq",
        description="raftmq: RocketMQ's architecture on Raft broker groups. "
        "Start a local cluster with `raftmq cluster up`.",
    )
    parser.add_argument(
        "--namesrv",
        default=os.environ.get("RAFTMQ_NAMESRV", DEFAULT_NAMESRV),
        help="NameServer addresses as host:port, separated by ',' or ';' (RocketMQ's NameServer "
        "port is 9876; an address without a port is refused) "
        f"(env RAFTMQ_NAMESRV; default {DEFAULT_NAMESRV})",
    )
    parser.add_argument("--verbose", action="store_true", help="log the SDK's own messages")
    parser.add_argument(
        "--version", action="version", version=f"raftmq {raftmq.__version__}", help="and exit"
    )
    for key, what in (("ca", "CA certificate"), ("cert", "client certificate"), ("key", "its key")):
        parser.add_argument(
            f"--tls-{key}",
            default=None,
            metavar="PATH",
            help=f"TLS {what} (PEM) for every connection (env RAFTMQ_TLS_{key.upper()}; a "
            "cluster description with [security.tls] gives its client certificate)",
        )
    # issue 19: a cluster with auth on needs signed requests; every command signs with these
    parser.add_argument(
        "--access-key", default="", help="access key to sign requests (env RAFTMQ_ACCESS_KEY)"
    )
    parser.add_argument("--secret-key", default="", help="its secret key (env RAFTMQ_SECRET_KEY)")
    parser.add_argument(
        "--credentials-file",
        default="",
        help="a TOML file with access_key and secret_key (env RAFTMQ_CREDENTIALS_FILE; default "
        "~/.raftmq/credentials.toml when it exists)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in subcommand_modules():
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            log.debug("cli.group_unavailable module=%s missing=%s", name, exc.name)
            continue  # its extra (raftmq[chaos], raftmq[server], ...) is not installed
        module.register(sub)
    from raftmq.ops import cli_acl, cli_dashboard  # not entry points yet: installed venvs lack them

    cli_dashboard.register(sub)
    cli_acl.register(sub)
    return parser


def use_credentials(args: argparse.Namespace) -> None:
    """--access-key/--secret-key/--credentials-file for every client this command makes: the
    SDK reads RAFTMQ_ACCESS_KEY, RAFTMQ_SECRET_KEY and RAFTMQ_CREDENTIALS_FILE (common/auth.py),
    so setting them in this short-lived process reaches every Admin, Producer and consumer."""
    for flag, env in (
        ("access_key", ENV_ACCESS_KEY),
        ("secret_key", ENV_SECRET_KEY),
        ("credentials_file", ENV_CREDENTIALS_FILE),
    ):
        value = getattr(args, flag, "")
        if value:
            os.environ[env] = value
    load_credentials()  # a half-given pair or a bad file fails here, once, with its reason


def join_relative_times(argv: Sequence[str]) -> list[str]:
    """`--from -10m` -> `--from=-10m`: argparse takes a value starting with '-' that is not
    a plain negative number for an option, so the documented form would fail without this."""
    out: list[str] = []
    for arg in argv:
        if out and out[-1] in RELATIVE_TIME_OPTIONS and _RELATIVE_TIME.fullmatch(arg):
            out[-1] = f"{out[-1]}={arg}"
        else:
            out.append(arg)
    return out


def chosen_parser(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> argparse.ArgumentParser:
    """The deepest subcommand parser that `args` went through (`raftmq topic create` -> its own)."""
    while True:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        name = getattr(args, subs[0].dest, None) if subs else None
        if name is None or name not in subs[0].choices:
            return parser
        parser = subs[0].choices[name]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(
        join_relative_times(sys.argv[1:] if argv is None else argv)
    )
    if extra:  # argparse would blame the top parser; the hint should name the subcommand's help
        chosen_parser(parser, args).error(f"unrecognized arguments: {' '.join(extra)}")
    configure_logging(logging.INFO if args.verbose else logging.WARNING)
    try:
        given = {"ca": args.tls_ca, "cert": args.tls_cert, "key": args.tls_key}
        if any(given.values()):
            tls.install(tls.load(given))
        use_credentials(args)
        return int(args.func(args))
    except RaftMQError as exc:
        err_console.print(
            f"[red]error ({exc.code}):[/] {literal(exc.message)}",
            highlight=False,
            soft_wrap=True,
        )
        return 1
    except (SpecError, SettingsError) as exc:  # CertsError is a SpecError
        err_console.print(f"[red]error:[/] {literal(str(exc))}", highlight=False, soft_wrap=True)
        return 2
    except KeyboardInterrupt:
        return 130
    except OSError as exc:  # a file or socket of this machine: one line, no traceback
        err_console.print(f"[red]error:[/] {literal(str(exc))}", highlight=False, soft_wrap=True)
        return 1
    except Exception as exc:  # a bug of ours: one line for the user, the traceback in the log
        log.debug("cli.internal_error", exc_info=exc)
        err_console.print(
            f"[red]internal error:[/] {type(exc).__name__}: {literal(str(exc))}; please "
            "report it "
            "(`--verbose` shows where)",
            highlight=False,
            soft_wrap=True,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
