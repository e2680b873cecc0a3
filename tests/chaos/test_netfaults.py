"""Fault states and their rulesets (pure), and, as root, that nft accepts every ruleset."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from chaos.netfaults import NetFaults, render_ruleset

HOSTS = ["n0", "n1", "n2", "client"]
PORTS = {h: f"rq0000h{i}" for i, h in enumerate(HOSTS)}


def test_isolate_blocks_both_ways_with_everyone() -> None:
    f = NetFaults.isolate("n0", HOSTS)
    assert f.blocked == {(a, b) for a in HOSTS for b in HOSTS if (a == "n0") != (b == "n0")}


def test_partition_leaves_unlisted_hosts_connected() -> None:
    f = NetFaults.partition([["n0"], ["n1", "n2"]], HOSTS)
    assert ("n0", "n1") in f.blocked and ("n2", "n0") in f.blocked
    assert not any("client" in pair for pair in f.blocked)
    assert ("n1", "n2") not in f.blocked


def test_one_way_ring_bridge_and_union() -> None:
    assert NetFaults.one_way("n0", "n1").blocked == {("n0", "n1")}
    five = ["a", "b", "c", "d", "e"]
    ring = NetFaults.ring(five)
    assert ("a", "b") not in ring.blocked and ("a", "e") not in ring.blocked
    assert ("a", "c") in ring.blocked and len(ring.blocked) == 10
    br = NetFaults.bridge(["a", "b"], ["d", "e"], "c")
    assert ("a", "d") in br.blocked and not any("c" in p for p in br.blocked)
    u = NetFaults.one_way("n0", "n1").union(NetFaults.none().with_loss("n2", 30))
    assert u.blocked == {("n0", "n1")} and u.loss == {"n2": 30} and not u.empty
    assert NetFaults.none().empty
    with pytest.raises(ValueError, match=r"0\.\.100"):
        NetFaults.none().with_loss("n0", 101)


def test_render_has_one_rule_per_pair_and_lets_arp_through() -> None:
    f = NetFaults.one_way("n0", "n1").union(NetFaults.none().with_loss("n2", 30))
    text = render_ruleset("rq0000", f, PORTS)
    assert text == render_ruleset("rq0000", f, PORTS)  # deterministic
    assert text.index("meta protocol != ip accept") < text.index("drop")
    assert 'iifname "rq0000h0" oifname "rq0000h1" drop' in text
    assert text.count("numgen random mod 100 < 30 drop") == 2
    assert "numgen" not in render_ruleset("t", NetFaults.none().with_loss("n0", 100), PORTS)
    with pytest.raises(KeyError, match="no bridge port"):
        render_ruleset("t", NetFaults.one_way("n0", "ghost"), PORTS)


@pytest.mark.skipif(
    shutil.which("nft") is None, reason="nft is not installed (apt-get install nftables)"
)
def test_nft_accepts_every_shape() -> None:
    shapes = [
        NetFaults.none(),
        NetFaults.isolate("n0", HOSTS),
        NetFaults.partition([["n0", "client"], ["n1", "n2"]], HOSTS),
        NetFaults.ring(HOSTS),
        NetFaults.none().with_loss("n1", 25).with_loss("n2", 100),
    ]
    for f in shapes:
        p = subprocess.run(
            ["nft", "-c", "-f", "-"], input=render_ruleset("rqtest", f, PORTS), text=True,
            capture_output=True, check=False,
        )  # fmt: skip
        assert p.returncode == 0, p.stderr
