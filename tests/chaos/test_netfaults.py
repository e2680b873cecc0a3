"""Fault states and their rulesets (pure): each shape drops exactly the expected directed pairs,
combinators compose, rendering is deterministic and, where nft exists and we are root, the
kernel's parser accepts every ruleset (`nft -c`: checked, never loaded)."""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftmq.chaos.netfaults import NetFaults, blocked_pairs, render_ruleset

HOSTS = ["namesrv-0", "controller-1", "broker-a-n0", "broker-a-n1", "broker-a-n2", "client"]
PORTS = {h: f"rq0a1bh{i}" for i, h in enumerate(HOSTS)}
HOST_OF_PORT = {p: h for h, p in PORTS.items()}
N0, N1, N2 = "broker-a-n0", "broker-a-n1", "broker-a-n2"


def both_ways(a: str, bs: list[str]) -> set[tuple[str, str]]:
    return {(a, b) for b in bs} | {(b, a) for b in bs}


def rendered_pairs(f: NetFaults) -> list[tuple[str, str]]:
    return list(blocked_pairs(render_ruleset("rq0a1b", f, PORTS), HOST_OF_PORT))


def test_none_is_empty_and_renders_no_drop() -> None:
    f = NetFaults.none()
    assert f.empty and f.blocked == frozenset() and dict(f.loss) == {}
    assert "drop" not in render_ruleset("rq0a1b", f, PORTS)


def test_isolate_cuts_the_host_from_everyone_both_ways() -> None:
    f = NetFaults.isolate(N0, HOSTS)
    assert f.blocked == both_ways(N0, [h for h in HOSTS if h != N0])
    assert sorted(rendered_pairs(f)) == sorted(f.blocked)


def test_partition_cuts_across_groups_and_leaves_unlisted_hosts_alone() -> None:
    f = NetFaults.partition([[N0], [N1, N2]], HOSTS)
    assert f.blocked == both_ways(N0, [N1, N2])
    assert sorted(rendered_pairs(f)) == sorted(f.blocked)
    three = NetFaults.partition([[N0], [N1], [N2, "client"]], HOSTS)
    assert three.blocked == both_ways(N0, [N1, N2, "client"]) | both_ways(N1, [N2, "client"])
    with pytest.raises(ValueError, match="more than one group"):
        NetFaults.partition([[N0, N1], [N1]], HOSTS)
    with pytest.raises(ValueError, match="unknown hosts"):
        NetFaults.partition([[N0], ["ghost"]], HOSTS)


@given(st.lists(st.integers(0, 3), min_size=len(HOSTS), max_size=len(HOSTS)))
def test_partition_blocks_exactly_the_cross_group_pairs(labels: list[int]) -> None:
    # label 3 = in no group
    groups = [[h for h, g in zip(HOSTS, labels, strict=True) if g == k] for k in range(3)]
    f = NetFaults.partition(groups, HOSTS)
    group_of = {h: g for h, g in zip(HOSTS, labels, strict=True) if g != 3}
    expected = {
        (a, b)
        for a, b in itertools.permutations(HOSTS, 2)
        if a in group_of and b in group_of and group_of[a] != group_of[b]
    }
    assert f.blocked == expected


def test_one_way_is_one_direction() -> None:
    f = NetFaults.one_way(N0, N1)
    assert f.blocked == {(N0, N1)}
    assert rendered_pairs(f) == [(N0, N1)]
    with pytest.raises(ValueError, match="itself"):
        NetFaults.one_way(N0, N0)


def test_ring_of_five_is_jepsens_majorities_ring() -> None:
    five = ["a", "b", "c", "d", "e"]
    f = NetFaults.ring(five)
    neighbours = {(x, y) for i, x in enumerate(five) for y in (five[i - 1], five[(i + 1) % 5])}
    assert f.blocked == set(itertools.permutations(five, 2)) - neighbours
    seen = {h: frozenset({h} | {y for x, y in neighbours if x == h}) for h in five}
    assert all(len(s) == 3 for s in seen.values())  # each sees a majority ...
    assert len(set(seen.values())) == 5  # ... and no two the same one


def test_ring_of_three_is_directed() -> None:
    f = NetFaults.ring([N0, N1, N2])
    assert f.blocked == {(N0, N1), (N1, N2), (N2, N0)}
    assert sorted(rendered_pairs(f)) == sorted(f.blocked)
    with pytest.raises(ValueError, match="at least 3"):
        NetFaults.ring([N0, N1])


def test_ring_of_four_and_six_leave_each_host_a_majority() -> None:
    for n in (4, 6, 7):
        hosts = [f"h{i}" for i in range(n)]
        f = NetFaults.ring(hosts)
        for h in hosts:
            reach = {h} | {o for o in hosts if o != h and (h, o) not in f.blocked}
            assert len(reach) > n // 2, (n, h, reach)
        assert f.blocked  # never a no-op


def test_bridge_cuts_the_halves_and_spares_the_middle() -> None:
    f = NetFaults.bridge(["a", "b"], ["d", "e"], "c")
    assert f.blocked == both_ways("a", ["d", "e"]) | both_ways("b", ["d", "e"])
    assert not any("c" in pair for pair in f.blocked)
    with pytest.raises(ValueError, match="neither side"):
        NetFaults.bridge(["a", "c"], ["d"], "c")


def test_loss_and_union() -> None:
    f = NetFaults.none().with_loss(N1, 30)
    assert dict(f.loss) == {N1: 30} and not f.empty
    assert NetFaults.none().with_loss(N1, 30).with_loss(N1, 0) == NetFaults.none()
    with pytest.raises(ValueError, match=r"0\.\.100"):
        NetFaults.none().with_loss(N1, 101)
    u = NetFaults.one_way(N0, N1).union(f).union(NetFaults.none().with_loss(N1, 20))
    assert u.blocked == {(N0, N1)} and dict(u.loss) == {N1: 30}  # the higher loss wins
    assert u == NetFaults.one_way(N0, N1) | f
    assert NetFaults.isolate(N0, HOSTS) | NetFaults.isolate(N1, HOSTS) == NetFaults.partition(
        [[N0], [N1], [h for h in HOSTS if h not in (N0, N1)]], HOSTS
    )
    assert len({u, NetFaults.one_way(N0, N1) | f}) == 1  # hashable, equal states collapse
    with pytest.raises(TypeError):
        u.loss[N2] = 5  # type: ignore[index]


def test_render_loss_rules_both_directions() -> None:
    text = render_ruleset("rq0a1b", NetFaults.none().with_loss(N1, 25), PORTS)
    port = PORTS[N1]
    assert f'iifname "{port}" numgen random mod 100 < 25 drop' in text
    assert f'oifname "{port}" numgen random mod 100 < 25 drop' in text
    full = render_ruleset("rq0a1b", NetFaults.none().with_loss(N1, 100), PORTS)
    assert "numgen" not in full and f'iifname "{port}" drop' in full


def test_render_shape_is_one_atomic_table_script() -> None:
    f = NetFaults.isolate(N0, HOSTS).with_loss(N2, 10)
    text = render_ruleset("rq0a1b", f, PORTS)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    assert lines[:3] == [
        "table bridge rq0a1b",
        "flush table bridge rq0a1b",
        "table bridge rq0a1b {",
    ]
    assert "chain fwd {" not in lines and "chain xfwd {" in lines
    assert "type filter hook forward priority -100; policy accept;" in lines
    # ARP must pass before any drop, or a heal waits for neighbour entries to come back.
    assert lines.index("meta protocol != ip accept") < min(
        i for i, ln in enumerate(lines) if ln.endswith("drop")
    )
    drops = [ln for ln in lines if ln.endswith("drop")]
    assert len(drops) == len(f.blocked) + 2


def test_render_is_deterministic_whatever_the_construction_order() -> None:
    a = NetFaults.one_way(N0, N1) | NetFaults.one_way(N2, N0) | NetFaults.none().with_loss(N1, 5)
    b = NetFaults.none().with_loss(N1, 5) | NetFaults.one_way(N2, N0) | NetFaults.one_way(N0, N1)
    assert render_ruleset("rq0a1b", a, PORTS) == render_ruleset("rq0a1b", b, PORTS)


def test_render_rejects_unknown_hosts_and_unsafe_names() -> None:
    with pytest.raises(KeyError, match="no bridge port"):
        render_ruleset("rq0a1b", NetFaults.one_way(N0, "ghost"), PORTS)
    with pytest.raises(ValueError, match="table"):
        render_ruleset("rq; flush ruleset", NetFaults.none(), PORTS)
    with pytest.raises(ValueError, match="port"):
        render_ruleset("rq0a1b", NetFaults.one_way(N0, N1), {**PORTS, N1: 'x" accept'})


def _nft_check_unavailable() -> str | None:
    if shutil.which("nft") is None:
        return "nft is not installed: `apt-get install -y nftables`"
    if os.geteuid() != 0:
        return "`nft -c` needs root (CAP_NET_ADMIN) to check a ruleset against the kernel"
    return None


@pytest.mark.skipif(_nft_check_unavailable() is not None, reason=_nft_check_unavailable() or "")
def test_nft_accepts_every_shape() -> None:
    shapes = [
        NetFaults.none(),
        NetFaults.isolate(N0, HOSTS),
        NetFaults.partition([[N0, "client"], [N1, N2]], HOSTS),
        NetFaults.one_way(N1, N0),
        NetFaults.ring([N0, N1, N2]),
        NetFaults.ring(HOSTS[:5]),
        NetFaults.bridge([N0], [N2], N1),
        NetFaults.none().with_loss(N1, 25).with_loss(N2, 100),
    ]
    for f in shapes:
        p = subprocess.run(["nft", "-c", "-f", "-"], input=render_ruleset("rq0a1b", f, PORTS),
                           text=True, capture_output=True, check=False, timeout=10)  # fmt: skip
        assert p.returncode == 0, (f, p.stderr)
