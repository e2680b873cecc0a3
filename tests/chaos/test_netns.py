"""Real namespaces on a real bridge (root): isolation, one-way drops, loss and delay act where
they should, the harness's control path survives every fault, and nothing is left behind, not
even by a run whose owner was SIGKILLed."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from chaos.netfaults import NetFaults
from chaos.netns import Net, _namespaces, cleanup, require_root_tools

WHY = require_root_tools()
pytestmark = pytest.mark.skipif(WHY is not None, reason=WHY or "")
PROBE = str(Path(__file__).with_name("probe.py"))
PORT = 7000
HOSTS = ["a", "b", "c", "client"]


@pytest.fixture
def net(tmp_path: Path) -> Iterator[Net]:
    with Net(HOSTS, state_dir=tmp_path) as n:
        servers = []
        for h in ("a", "b", "c"):
            p = subprocess.Popen(
                [*n.wrap(h), sys.executable, PROBE, "serve", str(PORT)], stdout=subprocess.PIPE
            )
            assert p.stdout is not None and p.stdout.readline().strip() == b"ready"
            servers.append(p)
        yield n
        for p in servers:
            p.kill()
            p.wait()


def reach(net: Net, src: str, dst: str, n: int = 1) -> list[float] | None:
    p = subprocess.run(
        [*net.wrap(src), sys.executable, PROBE, "connect", net.ip(dst), str(PORT), str(n)],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    return [float(x) for x in p.stdout.split()] if p.returncode == 0 else None


def from_root(net: Net, dst: str) -> bool:
    p = subprocess.run(
        [sys.executable, PROBE, "connect", net.ip(dst), str(PORT)], capture_output=True,
        timeout=30, check=False,
    )  # fmt: skip
    return p.returncode == 0


def test_faults_act_where_they_should(net: Net) -> None:
    assert reach(net, "client", "a") and reach(net, "b", "c")
    net.apply(NetFaults.isolate("a", net.hosts))
    assert reach(net, "client", "a") is None and reach(net, "b", "a") is None
    assert reach(net, "b", "c") and reach(net, "client", "c")
    assert from_root(net, "a")  # the control path is never cut
    net.apply(NetFaults.one_way("client", "b"))
    assert reach(net, "client", "b") is None and reach(net, "client", "c")
    net.apply(NetFaults.none().with_loss("c", 100))
    assert reach(net, "client", "c") is None and reach(net, "client", "a")
    net.heal()
    assert reach(net, "client", "c") and reach(net, "b", "a")


def test_delay_and_clear(net: Net) -> None:
    before = reach(net, "client", "b", 3)
    assert before is not None
    net.delay("b", 150)
    slow = reach(net, "client", "b", 3)
    assert slow is not None and min(slow) >= 140, slow
    fast = reach(net, "client", "a", 3)
    assert fast is not None and max(fast) < 100  # other hosts unaffected
    net.clear_delay("b")
    after = reach(net, "client", "b", 3)
    assert after is not None and max(after) < 100


def listing(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


def test_teardown_leaves_nothing(tmp_path: Path) -> None:
    n = Net(["x", "y"], state_dir=tmp_path).setup()
    ns, bridge, table = n.namespace("x"), n.bridge, n.table
    assert ns in _namespaces()
    n.teardown()
    n.teardown()  # idempotent
    assert ns not in _namespaces()
    assert bridge not in listing(["ip", "link"])
    assert table not in listing(["nft", "list", "tables"])
    assert not list(tmp_path.glob("*.json"))


def test_cleanup_after_a_killed_owner(tmp_path: Path) -> None:
    code = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from chaos.netns import Net\n"
        f"n = Net(['x', 'y'], state_dir=Path({str(tmp_path)!r})).setup()\n"
        "print(n.prefix, flush=True)\n"
        "time.sleep(60)\n"
    )
    root = Path(__file__).resolve().parents[2]
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=root)
    assert p.stdout is not None
    prefix = p.stdout.readline().strip()
    assert prefix.startswith("rq") and f"{prefix}-0" in _namespaces()
    assert not [r for r in cleanup(tmp_path) if prefix in r]  # owner alive: kept
    p.send_signal(signal.SIGKILL)
    p.wait()
    t = time.monotonic()
    removed = cleanup(tmp_path)
    assert time.monotonic() - t < 10
    assert f"namespace {prefix}-0" in removed and f"bridge {prefix}br" in removed
    assert f"{prefix}-0" not in _namespaces() and not list(tmp_path.glob("*.json"))
