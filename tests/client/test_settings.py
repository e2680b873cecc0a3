"""Typed settings: file < env < flags, unknown keys refused by name, the README table."""

from __future__ import annotations

import argparse
import enum
from dataclasses import dataclass
from pathlib import Path

import pytest

from raftmq.broker.settings import BrokerSettings
from raftmq.common.settings import (
    SettingInfo,
    SettingsError,
    add_settings_flags,
    flag_overrides,
    format_value,
    load_settings,
    section_for,
    setting,
    settings_class,
    settings_markdown,
    settings_table,
)
from raftmq.namesrv import settings as namesrv_settings
from raftmq.namesrv.settings import NameServerSettings

PREFIX = "RAFTMQ_DEMO_"


class Mode(enum.Enum):
    FAST = "fast"
    SAFE = "safe"


@settings_class
class Demo:
    timeout_ms: int = setting(default=3000, unit="ms", doc="how long to wait")
    ratio: float = setting(default=0.5, unit="", doc="a fraction")
    enabled: bool = setting(default=False, unit="bool", doc="switch")
    name: str = setting(default="demo", unit="", doc="a name")
    data_dir: Path = setting(default=Path("/tmp/demo"), unit="path", doc="where data lives")
    mode: Mode = setting(default=Mode.SAFE, unit="", doc="FAST or SAFE")
    peers: tuple[str, ...] = setting(default=(), unit="host:port list", doc="other members")
    password: str | None = setting(default=None, unit="", doc="optional secret")

    def __post_init__(self) -> None:
        if self.timeout_ms <= 0:
            raise ValueError("timeout_ms must be > 0")


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "raftmq.toml"
    path.write_text(text)
    return path


def test_defaults_without_any_source() -> None:
    assert load_settings(Demo, None, PREFIX, {}, environ={}) == Demo()


def test_file_then_env_then_flags(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '[demo]\ntimeout_ms = 100\nname = "from-file"\nenabled = true\npeers = ["a:1", "b:2"]\n'
        '[other]\ntimeout_ms = "ignored: another role\'s section"\n',
    )
    env = {"RAFTMQ_DEMO_TIMEOUT_MS": "200", "RAFTMQ_DEMO_MODE": "fast", "UNRELATED": "x"}
    s = load_settings(Demo, path, PREFIX, {"timeout_ms": "300", "ratio": None}, environ=env)
    assert s.timeout_ms == 300  # flag beats env beats file
    assert s.mode is Mode.FAST  # env
    assert s.name == "from-file" and s.enabled is True and s.peers == ("a:1", "b:2")
    assert s.ratio == 0.5  # a None override (flag not given) changes nothing

    s = load_settings(Demo, path, PREFIX, {}, environ=env)
    assert s.timeout_ms == 200


def test_string_parsing_of_every_type() -> None:
    env = {
        "RAFTMQ_DEMO_TIMEOUT_MS": "120_000",
        "RAFTMQ_DEMO_RATIO": "0.25",
        "RAFTMQ_DEMO_ENABLED": "yes",
        "RAFTMQ_DEMO_DATA_DIR": "/var/lib/raftmq",
        "RAFTMQ_DEMO_MODE": "SAFE",
        "RAFTMQ_DEMO_PEERS": "10.0.0.1:7001, 10.0.0.2:7001",
        "RAFTMQ_DEMO_PASSWORD": "s3cret",
    }
    s = load_settings(Demo, None, PREFIX, None, environ=env)
    assert s == Demo(
        timeout_ms=120_000,
        ratio=0.25,
        enabled=True,
        data_dir=Path("/var/lib/raftmq"),
        mode=Mode.SAFE,
        peers=("10.0.0.1:7001", "10.0.0.2:7001"),
        password="s3cret",
    )
    s = load_settings(Demo, None, PREFIX, {"password": "none", "enabled": "off"}, environ=env)
    assert s.password is None and s.enabled is False


@pytest.mark.parametrize(
    ("source", "key"),
    [("file", "timeout"), ("env", "TIMEOUT"), ("flag", "timeout")],
)
def test_unknown_keys_are_named(tmp_path: Path, source: str, key: str) -> None:
    path = write(tmp_path, f"[demo]\n{key} = 1\n") if source == "file" else None
    env = {f"RAFTMQ_DEMO_{key}": "1"} if source == "env" else {}
    flags = {key: "1"} if source == "flag" else {}
    with pytest.raises(SettingsError) as info:
        load_settings(Demo, path, PREFIX, flags, environ=env)
    text = str(info.value)
    assert "unknown Demo setting 'timeout'" in text
    assert "did you mean 'timeout_ms'?" in text


def test_a_removed_key_says_what_to_do_instead() -> None:
    """A key a release dropped is refused with its reason, not as a typo to correct."""
    env = {"RAFTMQ_BROKER_RAFT_IMPL": "pysyncobj"}
    with pytest.raises(SettingsError) as info:
        load_settings(BrokerSettings, None, "RAFTMQ_BROKER_", None, environ=env)
    text = str(info.value)
    assert "'raft_impl' from env RAFTMQ_BROKER_RAFT_IMPL was removed" in text
    assert "delete the key" in text and "unknown" not in text


def test_bad_values_name_key_source_and_unit(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=r"'timeout_ms' from env RAFTMQ_DEMO_TIMEOUT_MS.*ms"):
        load_settings(Demo, None, PREFIX, None, environ={"RAFTMQ_DEMO_TIMEOUT_MS": "soon"})
    with pytest.raises(SettingsError, match=r"'enabled' from flag --enabled.*not a boolean"):
        load_settings(Demo, None, PREFIX, {"enabled": "maybe"}, environ={})
    with pytest.raises(SettingsError, match=r"'mode' .* not one of FAST, SAFE"):
        load_settings(Demo, None, PREFIX, {"mode": "turbo"}, environ={})
    path = write(tmp_path, '[demo]\nname = 5\ntimeout_ms = "x"\n')
    with pytest.raises(SettingsError, match=r"raftmq.toml \[demo\]"):
        load_settings(Demo, path, PREFIX, None, environ={})


def test_validation_of_the_dataclass_becomes_settings_error() -> None:
    with pytest.raises(SettingsError, match="timeout_ms must be > 0"):
        load_settings(Demo, None, PREFIX, {"timeout_ms": -1}, environ={})


def test_missing_and_broken_files(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="cannot read settings file"):
        load_settings(Demo, tmp_path / "absent.toml", PREFIX, None, environ={})
    with pytest.raises(SettingsError, match="not valid TOML"):
        load_settings(Demo, write(tmp_path, "[demo\n"), PREFIX, None, environ={})
    with pytest.raises(SettingsError, match="must be a table"):
        load_settings(Demo, write(tmp_path, "demo = 3\n"), PREFIX, None, environ={})


def test_every_key_must_be_declared_with_setting() -> None:
    @dataclass(frozen=True, slots=True)
    class Undeclared:
        port: int = 5

    with pytest.raises(TypeError, match=r"Undeclared.port must be declared with setting"):
        settings_table(Undeclared)


def test_flags_from_argparse() -> None:
    parser = argparse.ArgumentParser()
    add_settings_flags(parser, Demo, PREFIX)
    ns = parser.parse_args(["--timeout-ms", "42", "--enabled", "--peers", "x:1,y:2"])
    overrides = flag_overrides(ns, Demo)
    assert overrides == {"timeout_ms": "42", "enabled": True, "peers": "x:1,y:2"}
    s = load_settings(Demo, None, PREFIX, overrides, environ={})
    assert (s.timeout_ms, s.enabled, s.peers) == (42, True, ("x:1", "y:2"))
    assert flag_overrides(parser.parse_args(["--no-enabled"]), Demo) == {"enabled": False}


def test_table_and_markdown() -> None:
    rows = settings_table(Demo)
    assert rows[0] == SettingInfo("timeout_ms", 3000, "ms", "how long to wait")
    assert [r.key for r in rows] == list(Demo.__dataclass_fields__)
    md = settings_markdown(Demo, PREFIX)
    assert "| `timeout_ms` | `3000` | ms | `RAFTMQ_DEMO_TIMEOUT_MS` | how long to wait |" in md
    assert format_value(Mode.FAST) == "FAST" and format_value(("a", "b")) == "a,b"
    assert section_for("RAFTMQ_NAMESRV_") == "namesrv"


def test_namesrv_settings_defaults_and_sources(tmp_path: Path) -> None:
    rows = {r.key: r for r in settings_table(NameServerSettings)}
    assert (rows["broker_expiry_ms"].default, rows["broker_expiry_ms"].unit) == (120_000, "ms")
    assert (rows["scan_interval_ms"].default, rows["scan_interval_ms"].unit) == (5_000, "ms")
    assert rows["listen"].default == "127.0.0.1:9876"
    assert namesrv_settings.load(environ={}) == NameServerSettings()

    path = write(tmp_path, '[namesrv]\nlisten = "0.0.0.0:9876"\nbroker_expiry_ms = 60000\n')
    env = {"RAFTMQ_NAMESRV_BROKER_EXPIRY_MS": "30000"}
    s = namesrv_settings.load(path, {"scan_interval_ms": "1000"}, environ=env)
    assert (s.listen, s.broker_expiry_ms, s.scan_interval_ms) == ("0.0.0.0:9876", 30_000, 1000)

    with pytest.raises(SettingsError, match="must not exceed broker_expiry_ms"):
        namesrv_settings.load(None, {"scan_interval_ms": 10_000, "broker_expiry_ms": 5_000}, {})
    with pytest.raises(SettingsError, match="not host:port"):
        namesrv_settings.load(None, {"listen": "localhost"}, {})
