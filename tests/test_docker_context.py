"""The Dockerfile's build context is right without a Docker engine: every path it COPYs is tracked
by git and not excluded by .dockerignore, every role folder the package links (raftmq/<role>) is
copied, and .dockerignore keeps the virtualenv, data and caches out of the context."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MUST_IGNORE = (".venv", ".git", "data", "chaos-results", ".mypy_cache", "common/__pycache__")


def _copy_sources() -> list[str]:
    """The source paths of every COPY instruction (the last word is the destination)."""
    out: list[str] = []
    for raw in (ROOT / "Dockerfile").read_text().splitlines():
        words = shlex.split(raw.split("#", 1)[0]) if raw.strip().upper().startswith("COPY") else []
        if words:
            assert not any(w.startswith("--from") for w in words), raw
            out += [w for w in words[1:-1] if not w.startswith("--")]
    return out


def _patterns() -> list[tuple[bool, re.Pattern[str]]]:
    """.dockerignore as (exclude?, regex over a context-relative path), Docker's rules: `**`
    any number of directories, `*` and `?` within one name, `!` re-includes."""
    out: list[tuple[bool, re.Pattern[str]]] = []
    for raw in (ROOT / ".dockerignore").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        exclude = not line.startswith("!")
        pattern = line.lstrip("!").strip("/")
        rx = ""
        i = 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                rx, i = rx + "(?:.*/)?", i + 3
            elif pattern.startswith("**", i):
                rx, i = rx + ".*", i + 2
            elif pattern[i] == "*":
                rx, i = rx + "[^/]*", i + 1
            elif pattern[i] == "?":
                rx, i = rx + "[^/]", i + 1
            else:
                rx, i = rx + re.escape(pattern[i]), i + 1
        out.append((exclude, re.compile(rx + r"\Z")))
    return out


def _ignored(path: str, patterns: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Excluded when the path or one of its parent directories matches; the last match wins."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    result = False
    for exclude, rx in patterns:
        if any(rx.match(p) for p in prefixes):
            result = exclude
    return result


def _tracked() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return [p for p in out.stdout.split("\0") if p]


def test_dockerignore_keeps_the_virtualenv_and_data_out() -> None:
    assert (ROOT / ".dockerignore").is_file(), "without .dockerignore the 1 GB .venv is sent"
    patterns = _patterns()
    for path in MUST_IGNORE:
        assert _ignored(path, patterns), f".dockerignore does not exclude {path}"


def test_every_copied_path_is_tracked_and_not_ignored() -> None:
    tracked = _tracked()
    patterns = _patterns()
    sources = _copy_sources()
    assert sources, "the Dockerfile copies nothing?"
    for src in sources:
        under = [p for p in tracked if p == src or p.startswith(src.rstrip("/") + "/")]
        assert under, f"the Dockerfile copies {src}, which git does not track"
        assert not _ignored(src, patterns), f".dockerignore excludes {src}, which is copied"
        dropped = [p for p in under if _ignored(p, patterns)]
        assert not dropped, f".dockerignore drops tracked files the image needs: {dropped[:5]}"


def test_every_role_folder_of_the_package_is_copied() -> None:
    """raftmq/<role> are links to the top-level folders; a folder not copied leaves the
    installed package without that role (an ImportError only when the container starts)."""
    sources = {s.rstrip("/") for s in _copy_sources()}
    links = [p for p in (ROOT / "raftmq").iterdir() if p.is_symlink()]
    assert links
    for link in links:
        target = (link.parent / link.readlink()).resolve().relative_to(ROOT).as_posix()
        assert target in sources, f"raftmq/{link.name} -> {target}, which the Dockerfile omits"
    for needed in ("raftmq", "pyproject.toml", "README.md", "pyspark_raftmq.py"):
        assert needed in sources, f"pip install . in the image needs {needed}"
