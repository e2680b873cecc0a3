"""The README's code blocks as tests run them: extraction, the address substitution and the
placeholder rule, in one place for tests/acceptance/test_readme.py and tests/spark.

Rules (visible on purpose, so a reader of a failure knows what ran):
- Every fenced block is extracted with its language and line. A block preceded by an HTML
  comment `<!-- readme-test: TAG -->` carries TAG: `spark` blocks run in tests/spark with the
  shared SparkSession; `sparkregister` blocks run from another directory in
  tests/spark/test_worker_python.py; `skip` blocks are not run (the comment says why).
- The README's NameServer addresses (README_NAMESRV, the `make run` cluster) are replaced by the
  test cluster's; other literal replacements are passed by the caller and listed in its test.
- A Python statement that is only `...` (a placeholder body: "your code runs here") becomes a
  bounded wait (`__readme_wait__()`), which returns once the block printed something or after
  the caller's limit.
- A sh block runs when each of its lines is a `raftmq` command (comments after `#` dropped).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
# What the README's snippets call the cluster, longest first: the list, then a single address.
README_NAMESRV = ("127.0.0.1:9876,127.0.0.1:9877", "127.0.0.1:9876")
WAIT_CALL = "__readme_wait__()"

_FENCE = re.compile(r"^```(\w*)\s*$")
_MARKER = re.compile(r"^<!--\s*readme-test:\s*(\w+).*-->\s*$")
_PLACEHOLDER = re.compile(r"^(\s*)\.\.\.(\s*#.*)?$", re.MULTILINE)
_CLI = ("raftmq", ".venv/bin/raftmq")


@dataclass(frozen=True, slots=True)
class Block:
    lang: str
    code: str
    line: int  # of the opening fence, 1-based
    tag: str  # from a `<!-- readme-test: TAG -->` line just before the fence; "" if none

    @property
    def name(self) -> str:
        return f"README.md:{self.line}:{self.lang}" + (f":{self.tag}" if self.tag else "")


def blocks(text: str) -> list[Block]:
    """Every fenced block of `text`, in order."""
    out: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        start = i
        i += 1
        body: list[str] = []
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        if i == len(lines):
            raise ValueError(f"README.md:{start + 1}: a code block is not closed")
        prev = next((ln for ln in reversed(lines[:start]) if ln.strip()), "")
        tag = _MARKER.match(prev.strip())
        out.append(
            Block(m.group(1), "\n".join(body) + "\n", start + 1, tag.group(1) if tag else "")
        )
        i += 1
    return out


def readme_blocks(lang: str, tag: str = "") -> list[Block]:
    return [b for b in blocks(README.read_text()) if b.lang == lang and b.tag == tag]


def substitute(code: str, namesrv: str, replacements: dict[str, str] | None = None) -> str:
    """The README's NameServer addresses become `namesrv`; then each of `replacements`."""
    for address in README_NAMESRV:
        code = code.replace(address, namesrv)
    for old, new in (replacements or {}).items():
        code = code.replace(old, new)
    return code


def with_bounded_waits(code: str) -> str:
    """Each placeholder statement `...` becomes a call of `__readme_wait__()`."""
    return _PLACEHOLDER.sub(lambda m: f"{m.group(1)}{WAIT_CALL}{m.group(2) or ''}", code)


def cli_commands(block: Block) -> list[list[str]] | None:
    """The block's `raftmq` commands (arguments after the program name), or None if some line
    is not one (such a block is not run)."""
    commands = []
    for raw in block.code.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        argv = shlex.split(line)
        if argv[0] not in _CLI:
            return None
        commands.append(argv[1:])
    return commands or None
