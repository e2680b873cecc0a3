"""Argument checks at the SDK's public entry points: a value of the wrong type (None for a count,
a list for a filter, NaN for a duration) is the caller's fault, raised as InvalidArgumentError
naming the argument, never an AttributeError or a comparison TypeError from deep inside.

Types come from the function's own annotations, checked with typeguard; ranges stay with each
function. For constructors and admin calls only: a check costs a few microseconds per argument,
too much for the per-message send path, which checks its few arguments by hand."""

from __future__ import annotations

import functools
import inspect
import math
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar

from google.protobuf.internal.enum_type_wrapper import EnumTypeWrapper
from typeguard import TypeCheckError, check_type

from raftmq.common.errors import InvalidArgumentError

F = TypeVar("F", bound=Callable[..., Any])


def _hints(fn: Callable[..., Any]) -> dict[str, Any]:
    """The resolvable annotations of `fn` (a name imported only for type checkers is skipped)."""
    try:
        return typing.get_type_hints(fn)
    except NameError:
        hints: dict[str, Any] = {}
        for name, text in fn.__annotations__.items():
            try:
                hints[name] = typing.get_type_hints(
                    type("_", (), {"__annotations__": {name: text}}), fn.__globals__
                )[name]
            except NameError:
                continue
        return hints


def _runtime_hint(hint: Any) -> Any:
    """`hint` as values have it at run time: a protobuf enum (`common_pb2.Permission`) is a
    class to type checkers but an EnumTypeWrapper object at run time, whose values are ints
    (in a union, `X | None` evaluates to the EnumTypeWrapper class itself)."""
    if isinstance(hint, EnumTypeWrapper) or hint is EnumTypeWrapper:
        return int
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return typing.Union[tuple(_runtime_hint(a) for a in typing.get_args(hint))]  # noqa: UP007
    return hint


def checked(fn: F) -> F:
    """Check every argument of `fn` against its annotation on each call."""
    sig = inspect.signature(fn)
    where = fn.__qualname__.removesuffix(".__init__")
    resolved: dict[str, Any] | None = None

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        nonlocal resolved
        if resolved is None:
            resolved = {
                k: _runtime_hint(v) for k, v in _hints(fn).items() if k not in ("self", "return")
            }
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError as exc:  # a missing or unknown argument: Python's message names it
            raise InvalidArgumentError(f"{where}: {exc}") from None
        for name, value in bound.arguments.items():
            hint = resolved.get(name)
            if hint is None:
                continue
            try:
                check_type(value, hint)
            except TypeCheckError as exc:
                raise InvalidArgumentError(
                    f"{where}: argument {name!r} {exc} (expected {_describe(hint)})",
                    details={"argument": name},
                ) from None
            if isinstance(value, float) and not math.isfinite(value):
                raise InvalidArgumentError(
                    f"{where}: argument {name!r} is {value}; give a finite number",
                    details={"argument": name},
                )
        return fn(*args, **kwargs)

    return typing.cast(F, wrapper)


def _describe(hint: Any) -> str:
    generic = typing.get_origin(hint) is not None  # Optional[int]: its name alone says nothing
    text = (None if generic else getattr(hint, "__name__", None)) or str(hint)
    return text.replace("typing.", "").replace("collections.abc.", "")
