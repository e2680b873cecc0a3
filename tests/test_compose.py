"""docker-compose.yml is generated from the cluster description, is current, is valid for
docker-compose, and each service's command parses with its role's own parser."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from raftmq.broker import server as broker_server
from raftmq.broker import settings as broker_settings
from raftmq.controller import server as controller_server
from raftmq.controller import settings as controller_settings
from raftmq.namesrv import server as namesrv_server
from raftmq.namesrv import settings as namesrv_settings
from raftmq.ops.cluster_spec import load
from raftmq.ops.compose import compose_yaml

ROOT = Path(__file__).resolve().parents[1]


def test_compose_file_is_current() -> None:
    assert (ROOT / "docker-compose.yml").read_text() == compose_yaml(
        load(ROOT / "deploy" / "cluster.toml")
    ), "docker-compose.yml is stale: run .venv/bin/raftmq cluster compose > docker-compose.yml"


def test_compose_file_is_valid_and_commands_parse() -> None:
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.fail("docker-compose is missing: `make deps` installs the Debian package")
    out = subprocess.run(
        [exe, "-f", "docker-compose.yml", "config", "--quiet"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    spec = load(ROOT / "deploy" / "cluster.toml")
    for raw in (ROOT / "docker-compose.yml").read_text().splitlines():
        line = raw.strip()
        if not line.startswith("command: "):
            continue
        argv = json.loads(line.removeprefix("command: "))
        assert argv[:2] == ["python", "-m"]
        module, args = argv[2], argv[3:]
        if module == "raftmq.namesrv.server":
            namesrv_settings.load(*namesrv_server.parse_args(args), environ={})
        elif module == "raftmq.broker.server":
            b = broker_settings.load(*broker_server.parse_args(args), environ={})
            assert b.me.address.startswith(f"{b.broker_group}-{b.node_id}:")
        else:
            assert module == "raftmq.controller.server" and spec.controllers
            c = controller_settings.load(*controller_server.parse_args(args), environ={})
            assert len(c.peer_list) == len(spec.controllers) - 1
