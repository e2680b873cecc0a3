"""The cluster description: parse errors name the key, and every process's argv is accepted by
that role's own parser and settings loader (a renamed setting breaks this test)."""

from __future__ import annotations

from pathlib import Path

import pytest

from raftmq.broker import server as broker_server
from raftmq.broker import settings as broker_settings
from raftmq.controller import server as controller_server
from raftmq.controller import settings as controller_settings
from raftmq.namesrv import server as namesrv_server
from raftmq.namesrv import settings as namesrv_settings
from raftmq.ops.cluster_spec import SpecError, load, parse
from raftmq.proxy import server as proxy_server
from raftmq.proxy import settings as proxy_settings

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "deploy" / "cluster.toml"


def test_default_description_has_the_documented_topology() -> None:
    spec = load(SPEC)
    names = [p.name for p in spec.processes()]
    assert names[:2] == ["namesrv-0", "namesrv-1"]
    assert sorted(spec.groups) == ["broker-a", "broker-b"]
    assert [p.name for p in spec.processes() if p.role == "broker"] == [
        f"broker-{g}-n{i}" for g in "ab" for i in range(3)
    ]


def test_every_argv_parses_with_its_role_settings() -> None:
    for p in load(SPEC).processes():
        if p.role == "namesrv":
            cfg, overrides = namesrv_server.parse_args(list(p.argv[2:]))
            ns = namesrv_settings.load(cfg, overrides, environ={})
            assert f"{p.host}:{p.ports[0]}" == ns.listen
        elif p.role == "broker":
            cfg, overrides = broker_server.parse_args(list(p.argv[2:]))
            b = broker_settings.load(cfg, overrides, environ={})
            assert b.me.address == f"{p.host}:{p.ports[0]}"
            assert b.me.raft_address == f"{p.host}:{p.ports[1]}"
            assert b.broker_group == p.group
            assert len(b.member_list) == 3
            assert b.controller_list == ("127.0.0.1:9881", "127.0.0.1:9882", "127.0.0.1:9883")
        elif p.role == "controller":
            cfg, overrides = controller_server.parse_args(list(p.argv[2:]))
            c = controller_settings.load(cfg, overrides, environ={})
            assert c.listen == f"{p.host}:{p.ports[0]}"
            assert c.raft_address == f"{p.host}:{p.ports[1]}"
            assert len(c.peer_list) == 2
        else:
            assert p.role == "proxy"
            cfg, overrides = proxy_server.parse_args(list(p.argv[2:]))
            px = proxy_settings.load(cfg, overrides, environ={})
            assert px.listen == px.advertised == f"{p.host}:{p.ports[0]}"
            assert px.namesrv_addresses == "127.0.0.1:9876,127.0.0.1:9877"


def test_proxies_in_the_description() -> None:
    text = SPEC.read_text()
    spec = load(SPEC)
    assert [p.name for p in spec.processes()][-1] == "proxy-0"  # after the brokers
    two = parse(text + "\n[[proxy]]\nhost = '127.0.0.1'\nport = 8082\n")
    argvs = [p.argv for p in two.processes() if p.role == "proxy"]
    assert len(argvs) == 2
    for argv in argvs:
        px = proxy_settings.load(*proxy_server.parse_args(list(argv[2:])), environ={})
        assert px.proxy_list == ("127.0.0.1:8081", "127.0.0.1:8082")
    moved = two.with_ports(list(range(30000, 30000 + two.port_count())))
    proxies_end = 30000 + two.port_count() - len(two.metrics_ports)  # metrics ports come last
    assert [e.port for e in moved.proxies] == [proxies_end - 2, proxies_end - 1]
    with pytest.raises(SpecError, match=r"both use 127\.0\.0\.1:8081"):
        parse(text + "\n[[proxy]]\nhost = '127.0.0.1'\nport = 8081\n")
    with pytest.raises(SpecError, match="no key 'max_long_poling_ms'"):
        parse(text + "\n[settings.proxy]\nmax_long_poling_ms = 1\n")


def test_hosts_and_ports_remap_consistently() -> None:
    spec = load(SPEC)
    hosts = {p.name: f"10.77.0.{i + 10}" for i, p in enumerate(spec.processes())}
    moved = spec.with_hosts(hosts).with_ports(list(range(30000, 30000 + spec.port_count())))
    for p in moved.processes():
        assert p.host == hosts[p.name]
        if p.role == "broker":
            cfg, overrides = broker_server.parse_args(list(p.argv[2:]))
            b = broker_settings.load(cfg, overrides, environ={})
            assert b.me.address == f"{p.host}:{p.ports[0]}"
            assert all(m.address.startswith("10.77.0.") for m in b.member_list)
            assert all(a.startswith("10.77.0.") for a in b.namesrv_list)


ONE_NS = "[[namesrv]]\nhost='h'\nport=1\n"
NODE = "nodes=[{id='n0',host='h',port=2,raft_port=3}]"


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("[[group]]\nname='a'\nnodes=[]", "namesrv"),
        ("[[namesrv]]\nhost='h'\nport=1", "group"),
        (
            "[[namesrv]]\nhost='h'\nport=70000\n[[group]]\nname='a'\nnodes=[{id='n0',host='h',port=2,raft_port=3}]",
            r"namesrv\[0\]\.port",
        ),
        (
            "[[namesrv]]\nhost='h'\nport=1\n[[group]]\nname='a'\nnodes=[{id='n0',host='h',port=1,raft_port=3}]",
            "both use h:1",
        ),
        (
            ONE_NS + "[[group]]\nname='a b'\n" + NODE,
            "letters",
        ),
        (ONE_NS + "[[group]]\nname='a'\npreferred_leader='n7'\n" + NODE, "prefers leader 'n7'"),
        ("[oops]\n", "unknown section"),
        ("not toml = = =", "not valid TOML"),
    ],
)
def test_errors_name_the_key(text: str, match: str) -> None:
    with pytest.raises(SpecError, match=match):
        parse(text)


def test_preferred_leader_reaches_every_controller() -> None:
    text = SPEC.read_text().replace(
        'name = "broker-b"\n', 'name = "broker-b"\npreferred_leader = "n2"\n'
    )
    spec = parse(text)
    assert spec.preferred_leaders == {"broker-b": "n2"}
    ctls = [p for p in spec.processes() if p.role == "controller"]
    assert len(ctls) == 3
    for p in ctls:
        cfg, overrides = controller_server.parse_args(list(p.argv[2:]))
        c = controller_settings.load(cfg, overrides, environ={})
        assert c.preferred_leaders == "broker-b=n2"


EMBEDDED = """
[cluster]
name = "E"
controller_in_namesrv = true
[[namesrv]]
host = "127.0.0.1"
port = 9876
raft_port = 9976
[[namesrv]]
host = "127.0.0.1"
port = 9877
raft_port = 9977
[[namesrv]]
host = "127.0.0.1"
port = 9878
raft_port = 9978
[[group]]
name = "broker-a"
preferred_leader = "n1"
nodes = [
  { id = "n0", host = "127.0.0.1", port = 10911, raft_port = 20911 },
  { id = "n1", host = "127.0.0.1", port = 10912, raft_port = 20912 },
  { id = "n2", host = "127.0.0.1", port = 10913, raft_port = 20913 },
]
[settings.controller]
balance_hold_ms = 7000
balance_leaders = false
"""


def embedded_settings(
    argv: tuple[str, ...],
) -> tuple[namesrv_settings.NameServerSettings, controller_settings.ControllerSettings]:
    cfg, ns_over, ctl_over = namesrv_server.parse_all(list(argv[2:]))
    ns = namesrv_settings.load(cfg, ns_over, environ={})
    assert ns.enable_controller
    return ns, namesrv_server.embedded_controller(ns, cfg, ctl_over, environ={})


def test_embedded_controllers_ride_in_the_namesrvs() -> None:
    spec = parse(EMBEDDED)
    procs = spec.processes()
    assert [p.role for p in procs] == ["namesrv"] * 3 + ["broker"] * 3
    assert spec.port_count() == 3 * 2 + 3 * 2
    raft = set()
    for i, p in enumerate(procs[:3]):
        ns, c = embedded_settings(p.argv)
        assert (c.node_id, c.listen) == (f"c{i}", ns.listen)
        assert c.raft_address == f"127.0.0.1:{9976 + i}" and p.ports == (9876 + i, 9976 + i)
        assert {m.address for m in c.peer_list} | {c.listen} == set(
            spec.namesrv_addresses.split(",")
        )
        raft |= {m.raft_address for m in c.peer_list} | {c.raft_address}
        assert c.namesrv_list == tuple(spec.namesrv_addresses.split(","))
        assert c.preferred_leaders == "broker-a=n1"
        assert c.balance_hold_ms == 7000 and c.balance_leaders is False
        assert str(c.data_dir).endswith(f"namesrv-{i}/controller")
    assert len(raft) == 3
    for p in procs[3:]:
        cfg, overrides = broker_server.parse_args(list(p.argv[2:]))
        b = broker_settings.load(cfg, overrides, environ={})
        assert b.controller_list == tuple(spec.namesrv_addresses.split(","))


def test_embedded_controllers_follow_remapped_namesrvs() -> None:
    spec = parse(EMBEDDED)
    hosts = {p.name: f"10.77.0.{i + 10}" for i, p in enumerate(spec.processes())}
    moved = spec.with_hosts(hosts).with_ports(list(range(30000, 30000 + spec.port_count())))
    ports = [port for p in moved.processes() for port in p.ports]
    assert sorted(ports) == list(range(30000, 30000 + spec.port_count()))
    for p in moved.processes():
        if p.role == "namesrv":
            _, c = embedded_settings(p.argv)
            assert c.listen == f"{hosts[p.name]}:{p.ports[0]}"
            assert c.raft_address == f"{hosts[p.name]}:{p.ports[1]}"
        else:
            cfg, overrides = broker_server.parse_args(list(p.argv[2:]))
            b = broker_settings.load(cfg, overrides, environ={})
            assert b.controller_list == tuple(moved.namesrv_addresses.split(","))


@pytest.mark.parametrize(
    ("text", "match"),
    [
        (EMBEDDED + "[[controller]]\nid='c9'\nhost='h'\nport=5\nraft_port=6\n", "remove the"),
        (EMBEDDED.replace("raft_port = 9977\n", ""), r"namesrv\[1\]\.raft_port"),
        (EMBEDDED.replace("controller_in_namesrv = true", "controller_in_namesrv = 1"), "true or"),
        (EMBEDDED.replace("raft_port = 9977", "raft_port = 10911"), "both use 127.0.0.1:10911"),
    ],
)
def test_embedded_errors_name_the_key(text: str, match: str) -> None:
    with pytest.raises(SpecError, match=match):
        parse(text)
