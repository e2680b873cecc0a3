"""Typed settings, the one mechanism every role uses: one `@settings_class` per role, every key
with its default, unit and meaning, layered as file section < environment variables < flags.

Values and parsing only: no threads, no sockets. Unknown keys are refused by name, never ignored.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import enum
import inspect
import os
import tomllib
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple, TypeVar, cast

if typing.TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T")
S = TypeVar("S")
C = TypeVar("C", bound=type[Any])

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
_NONE = frozenset({"", "none", "null"})


class SettingsError(ValueError):
    """A settings file, variable or flag is wrong; the message names the key and its source."""


class SettingInfo(NamedTuple):
    """One row of a role's settings table (the README documents these)."""

    key: str
    default: object
    unit: str  # "ms", "bytes", "threads", "host:port", ... ("" when unitless)
    doc: str


def setting(*, default: T, unit: str, doc: str, secret: bool = False) -> T:
    """Declare a settings key: `timeout_ms: int = setting(default=3000, unit="ms", doc="...")`.
    A `secret` key is never printed (see `redacted`) and never passed on a command line."""
    return dataclasses.field(default=default, metadata={"unit": unit, "doc": doc, "secret": secret})


REDACTED = "***"


def secret_keys(cls: type[Any]) -> frozenset[str]:
    """The keys of a settings class declared `secret=True`."""
    return frozenset(f.name for f in _fields(cls) if f.metadata.get("secret"))


def redacted(settings: DataclassInstance) -> dict[str, str]:
    """A settings object as text for a status table or a log: a secret that is set shows as
    REDACTED, an unset one as ""."""
    secrets = secret_keys(type(settings))
    out = {}
    for f in dataclasses.fields(settings):
        value = getattr(settings, f.name)
        if f.name in secrets:
            out[f.name] = REDACTED if value else ""
        else:
            out[f.name] = str(getattr(value, "value", None) or value)
    return out


def address_list(text: str, what: str) -> tuple[str, ...]:
    """An address list setting (`,` or `;` between host:port items) by the one common parser,
    as the ValueError every settings check raises, naming the key."""
    from raftmq.common.errors import InvalidArgumentError
    from raftmq.common.types import parse_address_list

    try:
        return parse_address_list(text, what)
    except InvalidArgumentError as exc:
        raise ValueError(exc.message) from None


@typing.dataclass_transform(frozen_default=True, field_specifiers=(setting,))
def settings_class(cls: C) -> C:
    """Make a role's settings class: a frozen, slotted dataclass whose keys use setting().

    (A decorator rather than bare @dataclass so type checkers and linters know `setting` is a
    field specifier, and so every settings class is frozen and slotted alike.)
    """
    made = dataclasses.dataclass(frozen=True, slots=True)(cls)
    _fields(made)
    return cast(C, made)


def _fields(cls: type[Any]) -> tuple[dataclasses.Field[Any], ...]:
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise TypeError(f"{cls!r} is not a settings dataclass")
    fields = dataclasses.fields(cls)
    for f in fields:
        if "unit" not in f.metadata or "doc" not in f.metadata:
            raise TypeError(f"{cls.__name__}.{f.name} must be declared with setting(...)")
        if f.default is dataclasses.MISSING:
            raise TypeError(f"{cls.__name__}.{f.name} has no default")
    return fields


def settings_table(cls: type[Any]) -> list[SettingInfo]:
    """Every key of a settings class with its default, unit and meaning, in declaration order:
    the class's own keys, then those it shares through a base (common/auth.py AuthSettings)."""
    own = inspect.get_annotations(cls)  # this class's own, not its bases'
    fields = sorted(_fields(cls), key=lambda f: f.name not in own)  # stable: order kept
    return [
        SettingInfo(f.name, f.default, str(f.metadata["unit"]), str(f.metadata["doc"]))
        for f in fields
    ]


def format_value(value: object) -> str:
    """A value as a user would write it in a file, variable or flag."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, tuple):
        return ",".join(format_value(v) for v in value)
    return str(value)


def settings_markdown(cls: type[Any], env_prefix: str) -> str:
    """The README table of a role's settings."""
    lines = ["| key | default | unit | env | meaning |", "|---|---|---|---|---|"]
    for row in settings_table(cls):
        default = format_value(row.default) or '""'
        env = f"{env_prefix}{row.key.upper()}"
        lines.append(f"| `{row.key}` | `{default}` | {row.unit} | `{env}` | {row.doc} |")
    return "\n".join(lines)


def section_for(env_prefix: str) -> str:
    """The file section of a role: "RAFTMQ_NAMESRV_" -> "namesrv"."""
    name = env_prefix.strip("_")
    name = name.removeprefix("RAFTMQ").strip("_")
    return name.lower()


def load_settings(
    cls: type[S],
    file: Path | None = None,
    env_prefix: str = "",
    overrides: Mapping[str, object] | None = None,
    *,
    section: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> S:
    """Build `cls` from defaults < `[section]` of the TOML `file` < `env_prefix`+KEY variables <
    `overrides` (flags; None values are skipped). Unknown keys and bad values raise SettingsError.
    """
    fields = {f.name: f for f in _fields(cls)}
    hints = typing.get_type_hints(cls)
    role = cls.__name__
    values: dict[str, object] = {}

    def put(key: str, raw: object, source: str) -> None:
        removed: Mapping[str, str] = getattr(cls, "REMOVED_SETTINGS", {})
        if key not in fields and key in removed:
            raise SettingsError(f"{role} setting {key!r} from {source} was removed: {removed[key]}")
        if key not in fields:
            close = difflib.get_close_matches(key, fields, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise SettingsError(
                f"unknown {role} setting {key!r} from {source}{hint} "
                f"(known: {', '.join(sorted(fields))})"
            )
        unit = fields[key].metadata["unit"]
        values[key] = _convert(hints[key], raw, f"{role} setting {key!r} from {source}", unit)

    if file is not None:
        sect = section if section is not None else section_for(env_prefix)
        for key, raw in _read_section(file, sect).items():
            put(key, raw, f"{file} [{sect}]" if sect else str(file))

    if env_prefix:
        env = os.environ if environ is None else environ
        for name in sorted(env):
            if name.startswith(env_prefix) and len(name) > len(env_prefix):
                put(name[len(env_prefix) :].lower(), env[name], f"env {name}")

    for key, raw in (overrides or {}).items():
        if raw is not None:
            put(key.replace("-", "_"), raw, f"flag --{key.replace('_', '-')}")

    try:
        return cast(Callable[..., S], cls)(**values)
    except (TypeError, ValueError) as exc:
        raise SettingsError(f"invalid {role} settings: {exc}") from exc


def changed(settings: S, updates: Mapping[str, str]) -> S:
    """`settings` with `updates` (key -> value as text, as a flag takes it) converted and
    checked by the class's own rules, as load_settings would; SettingsError names the key."""
    cls = type(settings)
    fields = {f.name: f for f in _fields(cls)}
    hints = typing.get_type_hints(cls)
    values: dict[str, object] = {}
    for key, raw in updates.items():
        if key not in fields:
            raise SettingsError(f"unknown {cls.__name__} setting {key!r}")
        unit = fields[key].metadata["unit"]
        values[key] = _convert(hints[key], raw, f"{cls.__name__} setting {key!r}", unit)
    try:
        return cast(S, dataclasses.replace(cast(Any, settings), **values))
    except (TypeError, ValueError) as exc:
        raise SettingsError(f"invalid {cls.__name__} settings: {exc}") from exc


def _read_section(file: Path, section: str) -> Mapping[str, object]:
    try:
        with open(file, "rb") as f:
            doc: dict[str, Any] = tomllib.load(f)
    except OSError as exc:
        raise SettingsError(f"cannot read settings file {file}: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"settings file {file} is not valid TOML: {exc}") from exc
    if not section:
        return doc
    table = doc.get(section, {})
    if not isinstance(table, dict):
        raise SettingsError(f"[{section}] in {file} must be a table, not {type(table).__name__}")
    return cast(Mapping[str, object], table)


def _convert(hint: Any, raw: object, where: str, unit: object) -> object:
    """Coerce a TOML value or a string (env, flag) to the declared type of a key."""
    unit_note = f" ({unit})" if unit else ""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)

    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        is_none = raw is None or (isinstance(raw, str) and raw.strip().lower() in _NONE)
        if is_none and len(inner) < len(args):
            return None
        if len(inner) != 1:
            raise TypeError(f"{where}: unsupported settings type {hint!r}")
        return _convert(inner[0], raw, where, unit)

    if origin is tuple:
        if len(args) != 2 or args[1] is not Ellipsis:
            raise TypeError(f"{where}: only tuple[X, ...] is supported, not {hint!r}")
        if isinstance(raw, str):
            items: list[object] = [p.strip() for p in raw.split(",") if p.strip()]
        elif isinstance(raw, list | tuple):
            items = list(raw)
        else:
            raise SettingsError(f"{where}: {raw!r} is not a list or a comma-separated string")
        return tuple(_convert(args[0], item, where, unit) for item in items)

    text = raw.strip() if isinstance(raw, str) else None
    if hint is bool:
        if isinstance(raw, bool):
            return raw
        if text is not None and text.lower() in _TRUE | _FALSE:
            return text.lower() in _TRUE
        raise SettingsError(f"{where}: {raw!r} is not a boolean (true or false)")
    if hint is int:
        if isinstance(raw, int) and not isinstance(raw, bool):
            return raw
        if text is not None:
            try:
                return int(text, 10)
            except ValueError:
                pass
        raise SettingsError(f"{where}: {raw!r} is not an integer{unit_note}")
    if hint is float:
        if isinstance(raw, int | float) and not isinstance(raw, bool):
            return float(raw)
        if text is not None:
            try:
                return float(text)
            except ValueError:
                pass
        raise SettingsError(f"{where}: {raw!r} is not a number{unit_note}")
    if hint is str:
        if isinstance(raw, str):
            return raw
        raise SettingsError(f"{where}: {raw!r} is not a string{unit_note}")
    if hint is Path:
        if text:
            return Path(text)
        raise SettingsError(f"{where}: {raw!r} is not a path")
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        for member in hint:
            if text is not None and text.upper() in (member.name, str(member.value).upper()):
                return member
        choices = ", ".join(m.name for m in hint)
        raise SettingsError(f"{where}: {raw!r} is not one of {choices}")
    raise TypeError(f"{where}: unsupported settings type {hint!r}")


# ---- flags ---------------------------------------------------------------------------------------


def add_settings_flags(
    parser: argparse.ArgumentParser, cls: type[Any], env_prefix: str, flag_prefix: str = ""
) -> None:
    """One `--key-name` flag per key (default None, so unset flags do not override). A
    flag_prefix ("controller-") lets one process take the settings of a role it embeds."""
    group = parser.add_argument_group(f"{cls.__name__} (flags override env {env_prefix}*)")
    hints = typing.get_type_hints(cls)
    for row in settings_table(cls):
        flag = "--" + flag_prefix + row.key.replace("_", "-")
        dest = _dest(flag_prefix, row.key)
        unit = f" {row.unit}" if row.unit and row.unit != "bool" else ""
        help_text = f"{row.doc} [default {format_value(row.default)}{unit}]".replace("%", "%%")
        if hints[row.key] is bool:
            group.add_argument(
                flag,
                dest=dest,
                default=None,
                action=argparse.BooleanOptionalAction,
                help=help_text,
            )
        else:
            group.add_argument(flag, dest=dest, default=None, metavar=_metavar(row), help=help_text)


def _metavar(row: SettingInfo) -> str:
    return row.unit.upper().replace(":", "_").replace(" ", "_") if row.unit else "VALUE"


def _dest(flag_prefix: str, key: str) -> str:
    return f"{flag_prefix.replace('-', '_')}_{key}" if flag_prefix else key


def flag_overrides(
    namespace: argparse.Namespace, cls: type[Any], flag_prefix: str = ""
) -> dict[str, object]:
    """The flags the user actually gave, ready for load_settings(overrides=...)."""
    given = vars(namespace)
    out = {}
    for row in settings_table(cls):
        value = given.get(_dest(flag_prefix, row.key))
        if value is not None:
            out[row.key] = value
    return out
