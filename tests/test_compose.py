"""docker-compose.yml is generated from the cluster description, is current, is valid for
docker-compose, and each service's command parses with its role's own parser; the host-reachable
mode publishes every client-facing port and makes every broker advertise host addresses."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from raftmq.broker import server as broker_server
from raftmq.broker import settings as broker_settings
from raftmq.broker.data_server import _WILDCARD_HOSTS
from raftmq.controller import server as controller_server
from raftmq.controller import settings as controller_settings
from raftmq.namesrv import server as namesrv_server
from raftmq.namesrv import settings as namesrv_settings
from raftmq.ops import cli
from raftmq.ops.cluster_spec import SpecError, load, parse
from raftmq.ops.compose import compose_yaml
from raftmq.proxy import server as proxy_server
from raftmq.proxy import settings as proxy_settings

ROOT = Path(__file__).resolve().parents[1]


def test_compose_file_is_current() -> None:
    assert (ROOT / "docker-compose.yml").read_text() == compose_yaml(
        load(ROOT / "deploy" / "cluster.toml")
    ), "docker-compose.yml is stale: run .venv/bin/raftmq cluster compose > docker-compose.yml"


def _validate(path: Path) -> None:
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.fail("docker-compose is missing: `make deps` installs the Debian package")
    out = subprocess.run(
        [exe, "-f", str(path), "config", "--quiet"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr


def _services(text: str) -> dict[str, dict[str, list[str]]]:
    """Service name -> its `command` argv and `ports` list (both JSON flow lists as rendered)."""
    out: dict[str, dict[str, list[str]]] = {}
    name = ""
    for raw in text.split("\nservices:\n", 1)[1].split("\nvolumes:\n", 1)[0].splitlines():
        if raw.startswith("  ") and not raw.startswith("    ") and raw.endswith(":"):
            name = raw.strip().rstrip(":")
            out[name] = {"command": [], "ports": []}
        for key in ("command", "ports"):
            if raw.strip().startswith(f"{key}: "):
                out[name][key] = json.loads(raw.strip().removeprefix(f"{key}: "))
    return out


def test_compose_file_is_valid_and_commands_parse() -> None:
    _validate(ROOT / "docker-compose.yml")
    dashboard = _services((ROOT / "docker-compose.yml").read_text())["dashboard"]
    # the host's loopback: no login; its /metrics ([dashboard] metrics_port) beside it
    assert dashboard["ports"] == ["127.0.0.1:8080:8080", "127.0.0.1:10082:10082"]
    assert dashboard["command"][-2:] == ["--metrics-listen", "0.0.0.0:10082"]
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
        elif module == "raftmq.proxy.server":
            px = proxy_settings.load(*proxy_server.parse_args(args), environ={})
            assert px.advertised.startswith("proxy-") and px.namesrv_addresses
        elif module == "raftmq.ops.cli":  # the dashboard ([dashboard] of the description)
            ns = cli.build_parser().parse_args(args)
            assert (
                ns.command == "dashboard"
                and ns.namesrv
                == spec.with_hosts(
                    {f"namesrv-{i}": f"namesrv-{i}" for i in range(len(spec.namesrvs))}
                ).namesrv_addresses
            )
            assert spec.dashboard and ns.listen == f"0.0.0.0:{spec.dashboard.port}"
        else:
            assert module == "raftmq.controller.server" and spec.controllers
            c = controller_settings.load(*controller_server.parse_args(args), environ={})
            assert len(c.peer_list) == len(spec.controllers) - 1


def _published(ports: list[str]) -> set[int]:
    out = set()
    for item in ports:
        host, container = item.split(":")[-2:]  # [bind ip:]host port:container port
        assert host == container, f"{item}: the published port must keep its number"
        out.add(int(host))
    return out


@pytest.mark.parametrize("advertise", [None, "mq.example.net"])
def test_host_reachable_mode_publishes_and_advertises_host_addresses(
    tmp_path: Path, advertise: str | None
) -> None:
    spec = load(ROOT / "deploy" / "cluster.toml")
    host = advertise or "127.0.0.1"
    chosen = {"advertise_host": advertise} if advertise else {}  # None: the default host
    text = compose_yaml(spec, host_reachable=True, **chosen)
    path = tmp_path / "docker-compose.host.yml"
    path.write_text(text)
    _validate(path)
    services = _services(text)
    assert set(services) == {p.name for p in spec.processes()}  # no dashboard: run it on the host
    for i, e in enumerate(spec.namesrvs):
        assert e.port in _published(services[f"namesrv-{i}"]["ports"])
    for c in spec.controllers:
        assert c.address.port in _published(services[c.name]["ports"])
    for i, e in enumerate(spec.proxies):
        argv = services[f"proxy-{i}"]["command"]
        px = proxy_settings.load(*proxy_server.parse_args(argv[3:]), environ={})
        assert px.listen == f"0.0.0.0:{e.port}" and px.advertised == f"{host}:{e.port}"
        # and its metrics port, when the description gives one (issue 27), as a broker's
        name = f"proxy-{i}"
        metrics = {spec.metrics_ports[name]} if name in spec.metrics_ports else set()
        assert _published(services[name]["ports"]) == {e.port, *metrics}
    brokers = 0
    for name, svc in services.items():
        argv = svc["command"]
        if argv[2] != "raftmq.broker.server":
            continue
        brokers += 1
        b = broker_settings.load(*broker_server.parse_args(argv[3:]), environ={})
        published = _published(svc["ports"])
        # gRPC: what the broker registers (and what its group's leader hints name) is its
        # `members` address; it binds every interface of its container on the same port.
        grpc_host, _, grpc_port = b.me.address.rpartition(":")
        assert grpc_host == host and int(grpc_port) in published, (name, b.me.address)
        assert b.listen == f"0.0.0.0:{grpc_port}"
        for m in b.member_list:
            assert m.address.startswith(f"{host}:"), m
            assert m.raft_address.startswith(f"{b.broker_group}-{m.node_id}:"), m
        # Data path: a wildcard bind is advertised on the gRPC address's host with the bound
        # (fixed, published) port (broker/data_server.py).
        bind = b.data_bind
        assert bind is not None and bind[0] in _WILDCARD_HOSTS and bind[1] in published
        assert bind[1] == int(grpc_port) + 1000
        # Metrics: the description's port, bound on every interface and published.
        metrics = spec.metrics_ports[name]
        assert b.metrics_listen == f"0.0.0.0:{metrics}"
        assert published == {int(grpc_port), bind[1], metrics}
    assert brokers == sum(len(n) for n in spec.groups.values())
    # Everything else keeps to the compose network.
    assert all(
        a.startswith(("namesrv-", "controller-")) for a in b.namesrv_list + b.controller_list
    )


def test_host_reachable_data_port_from_the_description_and_clashes_refused() -> None:
    text = (ROOT / "deploy" / "cluster.toml").read_text()
    spec = parse(text.replace("raft_port = 20911,", "raft_port = 20911, data_port = 30911,"))
    services = _services(compose_yaml(spec, host_reachable=True))
    assert _published(services["broker-a-n0"]["ports"]) == {10911, 30911, 12911}
    clash = parse(text.replace("raft_port = 20911,", "raft_port = 20911, data_port = 9876,"))
    with pytest.raises(SpecError, match="data port 9876 is also used by namesrv-0"):
        compose_yaml(clash, host_reachable=True)
    with pytest.raises(SpecError, match="advertise-host"):
        compose_yaml(spec, host_reachable=True, advertise_host="a:1")


def test_compose_command_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["cluster", "compose"]) == 0
    assert capsys.readouterr().out == (ROOT / "docker-compose.yml").read_text()
    assert cli.main(["cluster", "compose", "--host-reachable", "--advertise-host", "h1"]) == 0
    assert '"n0=h1:10911/broker-a-n0:20911' in capsys.readouterr().out
    assert cli.main(["cluster", "compose", "--advertise-host", "h1"]) == 2
    assert "needs --host-reachable" in capsys.readouterr().err


def test_proxies_in_both_modes_and_published_only_when_host_reachable(tmp_path: Path) -> None:
    """Every [[proxy]] is a service in both modes. In-network: it advertises its container
    hostname (clients in the compose network) and is not published. Host-reachable: it binds
    every interface, is published under its own port and advertises the host, and every proxy's
    list of proxies (what QueryRoute hands an official client as endpoints) names host addresses
    only, so a client on the host reaches whichever proxy serves a broker group."""
    text = (ROOT / "deploy" / "cluster.toml").read_text()
    spec = parse(text + '\n[[proxy]]\nhost = "127.0.0.1"\nport = 8082\n')
    assert [e.port for e in spec.proxies] == [8081, 8082]
    inside = _services(compose_yaml(spec))
    outside_text = compose_yaml(spec, host_reachable=True, advertise_host="mq.example.net")
    path = tmp_path / "docker-compose.host.yml"
    path.write_text(outside_text)
    _validate(path)
    outside = _services(outside_text)
    for i, e in enumerate(spec.proxies):
        name = f"proxy-{i}"
        px = proxy_settings.load(*proxy_server.parse_args(inside[name]["command"][3:]), environ={})
        assert px.listen == px.advertised == f"{name}:{e.port}"
        assert px.proxy_list == ("proxy-0:8081", "proxy-1:8082")
        assert inside[name]["ports"] == []
        px = proxy_settings.load(*proxy_server.parse_args(outside[name]["command"][3:]), environ={})
        assert px.listen == f"0.0.0.0:{e.port}"
        assert px.advertised == f"mq.example.net:{e.port}"
        assert px.proxy_list == ("mq.example.net:8081", "mq.example.net:8082")
        metrics = {spec.metrics_ports[name]} if name in spec.metrics_ports else set()
        assert _published(outside[name]["ports"]) == {e.port, *metrics}
