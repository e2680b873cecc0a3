"""The `raftmq` command's numeric options as argparse types: a count, a size, a rate or a number of
seconds out of its range (negative, zero where one is needed, NaN, infinite) is a usage error that
names the option and what it takes, before anything connects. Pure: no I/O."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def whole(minimum: int = 0, maximum: int | None = None) -> Callable[[str], int]:
    """An integer option in `minimum`..`maximum` (no upper bound when None)."""
    takes = f"a whole number of at least {minimum}"
    if maximum is not None:
        takes = f"a whole number from {minimum} to {maximum}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {takes}") from None
        if value < minimum or (maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(f"{value} is out of range: give {takes}")
        return value

    return parse


def amount(*, positive: bool = False) -> Callable[[str], float]:
    """A finite decimal option (seconds, messages per second): at least 0, or above 0 with
    `positive`. NaN and infinity are refused: a NaN timeout never ends and a NaN rate never
    paces."""
    takes = "a number above 0" if positive else "a number of at least 0"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {takes}") from None
        if not math.isfinite(value) or value < 0 or (positive and value == 0):
            raise argparse.ArgumentTypeError(f"{text!r} is out of range: give {takes}")
        return value

    return parse
