"""How `make test` splits the suite over pytest-xdist's workers (`-n 2 --dist loadgroup`).

Each test module is one group (its module-scoped cluster starts once), a package with package
fixtures (one cluster, one SparkSession) is one group, and every module that holds something
machine-wide is in the one SERIAL group, so no two of them ever run at once: fixed ports (the
README's and deploy/'s clusters, `cluster up` with its default file), network namespaces and
the chaos runner's cleanup, and the tests that assert a latency or a gap (they measure this
machine, so they must not share it with a second worker's cluster). Plain `pytest` (no -n)
ignores the groups.
"""

from __future__ import annotations

from pathlib import PurePosixPath

import pytest
from hypothesis import HealthCheck, settings

# Hypothesis's deadline and its "input generation is slow" check measure this machine, not the
# code: on a loaded CI runner they fail tests whose properties hold (a generation that took 1.1 s
# under load 20). Speed belongs in bench/; every property and its example count stay.
settings.register_profile("raftmq", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("raftmq")

# Packages whose fixtures are package-scoped: split over two workers they would start twice.
PACKAGE_GROUPS = ("tests/acceptance", "tests/spark")

# Modules that must never run beside another module (reasons above); a directory names all of
# its modules.
SERIAL = (
    "tests/chaos",
    "tests/test_compose.py",
    "tests/test_docs.py",
    "tests/test_packaging.py",
    "tests/client/test_cluster_cli.py",
    "tests/client/test_cluster_spec.py",
    "tests/client/test_hostile_input.py",
    "tests/fuzz/test_cli_fuzz.py",
    "tests/ops/test_cluster_lifecycle.py",
    "tests/ops/test_dashboard.py",
    "tests/ops/test_metrics.py",
    "tests/ops/test_secure_cluster.py",
    "tests/ops/test_secure_recipe.py",
    "tests/ops/test_security_cluster.py",
    "tests/ops/test_tls_cluster.py",
    "tests/proxy/test_nodejs_client.py",
    "tests/proxy/test_official_client.py",
    # latencies, gaps and timings measured on this machine
    "tests/broker/test_data_server.py",
    "tests/broker/test_disk_filling.py",
    "tests/broker/test_fair_share_data_port.py",
    "tests/broker/test_server.py",
    "tests/client/test_queue_selector.py",
    "tests/common/test_metrics_http.py",
    "tests/common/test_transport.py",
    "tests/raftlog/test_isolation.py",
    "tests/controller/test_alarms_cluster.py",
    "tests/controller/test_failover.py",
)


def _group_of(path: str) -> str:
    for serial in SERIAL:
        if path == serial or path.startswith(serial + "/"):
            return "serial"
    for package in PACKAGE_GROUPS:
        if path.startswith(package + "/"):
            return package
    return path


# tryfirst: xdist's worker reads the marks in its own pytest_collection_modifyitems (it suffixes
# each node id with `@group`, which is all its scheduler sees), and a conftest's hook would
# otherwise run after it: the marks would be set too late, silently.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = PurePosixPath(str(config.rootpath))
    for item in items:
        path = str(PurePosixPath(str(item.path)).relative_to(root))
        item.add_marker(pytest.mark.xdist_group(_group_of(path)))


_UNGROUPED = pytest.StashKey[str]()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Fail every test when the groups did not take, rather than run module clusters side by side.

    The grouping has failed silently twice: the hook order above, and pytest 9.2, whose node
    ids no longer change when xdist 3.8 rewrites them (pytest-xdist issue #1386; pyproject pins
    pytest below 9.2 until xdist follows). Both left each test scheduled on its own, so the
    SERIAL modules ran beside other clusters. (A worker that raises here only crashes, its
    message lost; a failed setup says why on every test.)
    """
    if not getattr(session.config.option, "loadgroup", False):
        return  # not an xdist worker under --dist loadgroup
    ungrouped = [i.nodeid for i in session.items if "@" not in i.nodeid.rsplit("::", 1)[-1]]
    if ungrouped:
        session.config.stash[_UNGROUPED] = (
            f"--dist loadgroup: {len(ungrouped)} tests carry no group (first: {ungrouped[0]}): "
            "pytest-xdist did not apply tests/conftest.py's groups, so modules would share this "
            "machine with each other. Check pytest's and pytest-xdist's versions against the pins "
            "in pyproject.toml."
        )


def pytest_runtest_setup(item: pytest.Item) -> None:
    if message := item.config.stash.get(_UNGROUPED, ""):
        pytest.fail(message, pytrace=False)
