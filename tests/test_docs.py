"""The docs as an operator reads them cannot drift from the code (issue 26): every count of chaos
scenarios in the README, docs/ and the Makefile is today's (`raftmq chaos list`: the full list or
the CI set), unless the sentence says it was the count "then" (a recorded run); no doc names a
path of the machine it was written on; the CLI commands the README's tables name parse, and
`raftmq --version` says the version the docs are of."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from raftmq.chaos.scenarios import SCENARIOS, ci_set
from raftmq.ops import cli

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "Makefile", *sorted((ROOT / "docs").glob("*.md"))]
WORDS = {"six": 6, "seven": 7, "eight": 8, "twenty": 20}
COUNT = re.compile(r"\b(\d+|" + "|".join(WORDS) + r")\s+(?:fault\s+)?scenarios\b(?!\s+then)")
# A home, a work tree or a mount of the machine a doc was written on.
MACHINE_PATH = re.compile(r"(?<![\w.<])/(?:work|home|Users|root|mnt)/[\w.-]+")


def test_every_chaos_scenario_count_is_todays() -> None:
    allowed = {len(SCENARIOS), len(ci_set())}
    wrong = []
    for path in DOCS:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for m in COUNT.finditer(line):
                raw = m.group(1)
                count = WORDS[raw] if raw in WORDS else int(raw)
                if count not in allowed:
                    wrong.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not wrong, (
        f"chaos scenario counts other than today's {sorted(allowed)} (full list, CI set); "
        "write the count of `raftmq chaos list`, or 'N scenarios then' for a recorded run:\n"
        + "\n".join(wrong)
    )


def test_no_doc_names_a_path_of_the_machine_it_was_written_on() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{n}: {m.group(0)}"
        for path in DOCS
        for n, line in enumerate(path.read_text().splitlines(), 1)
        for m in MACHINE_PATH.finditer(line)
    ]
    assert not found, "absolute machine paths in the docs:\n" + "\n".join(found)


OPERATIONS = ROOT / "docs" / "operations.md"
# A row of docs/operations.md's table: ... | `raftmq COMMAND` | tests/...py |
_OPS_ROW = re.compile(r"^\|.*\| `raftmq ([^`]+)` \| (tests/[\w/]+\.py) \|$")


def _table_commands() -> list[str]:
    """The `raftmq ...` commands in the first column of the README's tables, and in the
    raftmq column of docs/operations.md's."""
    out = []
    for line in (ROOT / "README.md").read_text().splitlines():
        m = re.match(r"^\| `raftmq ([^`]+)` \|", line)
        if m:
            out.append(m.group(1).replace("\\|", "|"))
    out += [command for command, _ in _operations_rows()]
    return out


def _operations_rows() -> list[tuple[str, str]]:
    rows = []
    for line in OPERATIONS.read_text().splitlines():
        m = _OPS_ROW.match(line)
        if m:
            rows.append((m.group(1).replace("\\|", "|"), m.group(2)))
    return rows


def test_every_operations_row_names_a_test_that_runs_its_command() -> None:
    """docs/operations.md: each task's command is in the test its row names (the subcommand's
    words as the test passes them to the CLI), and the table is not empty."""
    rows = _operations_rows()
    assert len(rows) >= 30, rows
    for command, test in rows:
        words = [w for w in command.split() if not w.startswith(("[", "-")) and w.islower()][:2]
        text = (ROOT / test).read_text()
        wanted = ", ".join(f'"{w}"' for w in words) if words else '"--version"'
        assert wanted in text, f"`raftmq {command}`: {test} never runs {wanted}"


@pytest.mark.parametrize("command", _table_commands())
def test_the_readmes_table_commands_parse(command: str) -> None:
    """Each command as the table writes it (its first alternative of `a|b`, optional parts
    dropped, placeholders filled) is one the parser takes."""
    first = re.sub(r"\|(?:--)?[\w-]+(?: [A-Z]\b)?", "", command)  # `a N|b N` -> `a N`
    argv = [w for w in re.sub(r"\[[^\]]*\]", "", first).split() if w != "..."]
    filled = [{"T": "t", "G": "g", "N": "1", "K": "k", "X": "x"}.get(a, a) for a in argv]
    try:
        cli.build_parser().parse_args(cli.join_relative_times(filled))
    except SystemExit as exc:
        if exc.code == 0:  # --version, --help: printed and done
            return
        pytest.fail(f"`raftmq {command}` does not parse (exit {exc.code}): {filled}")


def test_version_prints_the_packages_version(capsys: pytest.CaptureFixture[str]) -> None:
    import raftmq

    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"raftmq {raftmq.__version__}"
