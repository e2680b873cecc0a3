"""The README's settings tables are made from the settings classes and must not drift."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_settings_tables_are_current() -> None:
    out = subprocess.run(
        [sys.executable, "scripts/settings_tables.py", "--check", "README.md"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
