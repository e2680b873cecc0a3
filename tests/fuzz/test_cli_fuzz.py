"""The `raftmq` command fed random argument vectors built from its own parser (every subcommand,
its options with garbage, boundary and missing values, unknown flags), run in-process against a
NameServer address where nothing listens. Every run ends with exit code 0, 1 or 2, says why on
stderr in one line when it fails, and never prints a traceback or an internal error.
Commands that start or stop processes or serve until interrupted (`cluster up/down`, `chaos`,
`dashboard`) are parsed, never run."""

from __future__ import annotations

import argparse
import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raftmq.ops import cli

EXAMPLES = int(os.environ.get("RAFTMQ_FUZZ_EXAMPLES", "25")) * 4
DEAD_NAMESRV = "127.0.0.1:1"  # connection refused at once: commands fail fast, typed
# Serving until interrupted (cluster up, dashboard) or touching the host (cluster down, chaos).
NOT_RUN = {("cluster", "up"), ("cluster", "down"), ("chaos",), ("dashboard",)}
VALUES = ["", "-1", "0", "1", "99999999999999999999", "-10m", "1h", "abc", "%RETRY%g",
          "a b", "名前", "x" * 300, "||", "TagA && TagB", "a = = 'b'", "127.0.0.1:99999",
          "localhost", "broker-a", "n9", "{}", "[1", "nope.toml", "--", "-x"]  # fmt: skip


def _commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
        return
    for name, child in subs[0].choices.items():
        yield from _commands(child, (*path, name))


COMMANDS = sorted(_commands(cli.build_parser()), key=lambda c: c[0])


def _options(parser: argparse.ArgumentParser) -> list[tuple[str, int]]:
    """(flag, number of values) of the parser's optional arguments."""
    out = []
    for a in parser._actions:
        if not a.option_strings or a.dest == "help":
            continue
        nargs = 0 if a.nargs == 0 else 1
        out.append((a.option_strings[-1], nargs))
    return out


def _positionals(parser: argparse.ArgumentParser) -> int:
    return sum(1 for a in parser._actions if not a.option_strings and a.dest != "help")


@st.composite
def argv_of(draw: st.DrawFn) -> list[str]:
    path, parser = draw(st.sampled_from(COMMANDS))
    argv = ["--namesrv", DEAD_NAMESRV, *path]
    value = st.one_of(st.sampled_from(VALUES), st.text(max_size=12))
    n_pos = _positionals(parser) + draw(st.integers(-1, 1))
    argv += [draw(value) for _ in range(max(0, n_pos))]
    options = _options(parser)
    for flag, nargs in draw(st.lists(st.sampled_from(options), max_size=4)) if options else []:
        argv.append(flag)
        if nargs and draw(st.integers(0, 9)) > 0:  # sometimes the value is missing
            argv.append(draw(value))
    if draw(st.integers(0, 9)) == 0:
        argv.append(draw(st.sampled_from(["--bogus", "-z", "--namesrv"])))
    return argv


def _not_run(argv: list[str]) -> bool:
    words = tuple(a for a in argv[2:4])
    return any(words[: len(p)] == p for p in NOT_RUN)


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(argv=argv_of())
def test_random_argument_vectors_end_in_one_line(
    argv: list[str],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # `cluster certs` (and any --out) writes relative to the working directory: not the repo's
    monkeypatch.chdir(tmp_path)
    if _not_run(argv) and "--help" not in argv:
        argv = [*argv, "--help"] if random.random() < 0 else argv
        try:  # parse only: these start or stop real processes
            cli.build_parser().parse_args(cli.join_relative_times(argv))
        except SystemExit as exc:
            assert exc.code in (0, 2)
        err = capsys.readouterr().err
        assert "Traceback" not in err
        return
    try:
        code = cli.main(argv)
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        code = exc.code if isinstance(exc.code, int) else 2
    out, err = capsys.readouterr()
    assert code in (0, 1, 2), (argv, code, err)
    assert "Traceback" not in out + err, (argv, err)
    assert "internal error" not in err, (argv, err)
    if code != 0:
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert len(lines) == 1, (argv, err)
