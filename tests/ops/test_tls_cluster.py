"""TLS on every channel, with real processes: a cluster of a description with [security.tls]
(certificates from `raftmq cluster certs`'s code) serves produce/consume over TLS, refuses a
plaintext client and, with mutual TLS, a client without a certificate, with a typed error in
seconds; node certificates are rotated under the same CA by restarting the nodes of a group one
at a time while a producer sends, with 0 failed sends."""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftmq.client.admin import Admin
from raftmq.client.consumer_pull import PullConsumer
from raftmq.client.offsets import StartFrom
from raftmq.client.producer import Producer
from raftmq.common.errors import RaftMQError, TopicAlreadyExistsError
from raftmq.ops.certs import CertRequest, write_certs
from raftmq.ops.cluster_runner import ClusterRunner
from raftmq.ops.cluster_spec import ClusterSpec, local_description, parse
from tests.harness.procs import ROOT, free_ports, wait_until

N_PORTS = 1 + 3 * 2 + 3  # one NameServer, one group (gRPC + Raft), metrics of each


def make_spec(tmp: Path) -> ClusterSpec:
    certs = tmp / "certs"
    extra = (
        "[settings.broker]\nheartbeat_interval_ms=1000\n"
        f"[security.tls]\nenabled=true\ndir='{certs}'\nrequire_client_cert=true\n"
    )
    text = local_description(
        free_ports(N_PORTS + 1),
        tmp / "data",
        name="Tls",
        namesrvs=1,
        controllers=0,
        extra=extra,
        metrics=True,
    )
    (tmp / "cluster.toml").write_text(text)  # for the commands that take --spec
    spec = parse(text)
    write_certs(certs, [CertRequest(n, ("127.0.0.1",)) for n in spec.tls_names()], days=2)
    return spec


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterRunner]:
    spec = make_spec(tmp_path_factory.mktemp("tls"))
    spec.check_tls_files()
    runner = ClusterRunner(spec)
    try:
        runner.start_all()
        yield runner
    finally:
        runner.stop_all()


def tls_args(spec: ClusterSpec, cert: bool = True) -> dict[str, str]:
    assert spec.tls is not None
    out = {"tls_ca": str(spec.tls.ca)}
    if cert:
        out |= {"tls_cert": str(spec.tls.cert("client")), "tls_key": str(spec.tls.key("client"))}
    return out


def served_cert(spec: ClusterSpec, address: str) -> str:
    """The certificate (PEM) a TLS port presents, after a full mutual handshake."""
    assert spec.tls is not None
    ctx = ssl.create_default_context(cafile=str(spec.tls.ca))
    ctx.load_cert_chain(spec.tls.cert("client"), spec.tls.key("client"))
    host, _, port = address.rpartition(":")
    with (
        socket.create_connection((host, int(port)), timeout=10) as raw,
        ctx.wrap_socket(raw, server_hostname=host) as s,
    ):
        der = s.getpeercert(binary_form=True)
    assert der is not None
    return ssl.DER_cert_to_PEM_cert(der)


def wait_leader(spec: ClusterSpec, timeout_s: float = 60) -> None:
    with Admin(spec.namesrv_addresses, **tls_args(spec)) as admin:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if all(g.leader_address for g in admin.groups()) and admin.groups():
                    return
            except RaftMQError:
                pass
            time.sleep(0.2)
    raise AssertionError("no leader over TLS")


def test_produce_consume_over_tls(cluster: ClusterRunner) -> None:
    spec = cluster.spec
    wait_leader(spec)
    with Admin(spec.namesrv_addresses, **tls_args(spec)) as admin:
        admin.create_topic("secure", queues=2)
    with Producer(spec.namesrv_addresses, **tls_args(spec)) as p:
        for i in range(50):
            p.send("secure", f"m{i}".encode())
    got: list[bytes] = []
    with PullConsumer(
        spec.namesrv_addresses, "g-secure", start_from=StartFrom.EARLIEST, **tls_args(spec)
    ) as c:
        c.subscribe("secure")
        deadline = time.monotonic() + 60
        while len(got) < 50 and time.monotonic() < deadline:
            got += [m.body for m in c.poll(timeout_ms=1000)]
    assert sorted(got) == sorted(f"m{i}".encode() for i in range(50))


def test_metrics_are_https_only(cluster: ClusterRunner) -> None:
    spec = cluster.spec
    assert spec.tls is not None
    _, url = spec.metrics_endpoints()[0]
    assert url.startswith("https://")
    ctx = ssl.create_default_context(cafile=str(spec.tls.ca))
    ctx.load_cert_chain(spec.tls.cert("client"), spec.tls.key("client"))
    with urllib.request.urlopen(url.replace("/metrics", "/healthz"), context=ctx, timeout=10) as r:
        assert r.status == 200
    with pytest.raises(OSError):  # plaintext HTTP to the TLS port: no answer but a reset
        urllib.request.urlopen(url.replace("https://", "http://"), timeout=10).read()


@pytest.mark.parametrize("cert", [False, True], ids=["no-tls", "tls-without-client-cert"])
def test_client_refused_with_typed_error(cluster: ClusterRunner, cert: bool) -> None:
    """A plaintext client, and (mutual TLS) a TLS client without a certificate: refused with a
    RaftMQError within the route lookup's bounded time, no hang and no traceback."""
    spec = cluster.spec
    wait_leader(spec)
    kwargs = {"tls_ca": str(spec.tls.ca)} if cert and spec.tls else {}
    start = time.monotonic()
    with (
        pytest.raises(RaftMQError) as err,
        Producer(spec.namesrv_addresses, send_timeout_ms=5000, **kwargs) as p,
    ):
        p.send("secure", b"x")
    assert time.monotonic() - start < 30
    assert "TLS" in err.value.message or "tls" in err.value.message.lower(), err.value.message


def test_cli_with_tls_flags_and_without(cluster: ClusterRunner) -> None:
    spec = cluster.spec
    assert spec.tls is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAFTMQ_TLS_")}
    env |= {"PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    base = [sys.executable, "-m", "raftmq.ops.cli", "--namesrv", spec.namesrv_addresses]
    flags = ["--tls-ca", str(spec.tls.ca), "--tls-cert", str(spec.tls.cert("client"))]
    flags += ["--tls-key", str(spec.tls.key("client"))]
    # The topic this test reads is its own to make: pytest-xdist may run it in another worker than
    # the test that creates "secure" there (each worker starts the module's cluster; see
    # tests/conftest.py). The NameServer has its route at the broker's next registration (every
    # 1 s here). Wait for the route (with the flags), then check both forms.
    with Admin(spec.namesrv_addresses, **tls_args(spec)) as admin:
        with contextlib.suppress(TopicAlreadyExistsError):
            admin.create_topic("secure", queues=2)
        wait_until(lambda: admin.route("secure"), 30, "the NameServer's route to 'secure'")
    ok = subprocess.run(
        [*base, *flags, "topic", "route", "secure"], env=env, capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = subprocess.run(
        [*base, "topic", "route", "secure"], env=env, capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert "TLS" in bad.stderr, bad.stderr


def test_dashboard_serves_https_with_its_own_certificate(cluster: ClusterRunner) -> None:
    spec = cluster.spec
    assert spec.tls is not None
    port, metrics_port = free_ports(2)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAFTMQ_TLS_")}
    env["PYTHONPATH"] = str(ROOT)
    cmd = [sys.executable, "-m", "raftmq.ops.cli", "dashboard", "--listen", f"127.0.0.1:{port}"]
    cmd += ["--spec", str(spec.data_dir.parent / "cluster.toml")]
    cmd += ["--metrics-listen", f"127.0.0.1:{metrics_port}"]  # issue 27: as the dashboard's TLS
    dash = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        assert dash.stdout is not None
        first = dash.stdout.readline().decode()
        assert first.startswith(f"dashboard: https://127.0.0.1:{port}/"), first
        ctx = ssl.create_default_context(cafile=str(spec.tls.ca))
        ctx.load_cert_chain(spec.tls.cert("client"), spec.tls.key("client"))
        with urllib.request.urlopen(f"https://127.0.0.1:{port}/", context=ctx, timeout=30) as r:
            assert r.status == 200 and b"broker-a" in r.read()
        assert served_cert(spec, f"127.0.0.1:{port}") == spec.tls.cert("dashboard").read_text()
        metrics = f"127.0.0.1:{metrics_port}"
        with urllib.request.urlopen(f"https://{metrics}/metrics", context=ctx, timeout=30) as r:
            assert r.status == 200 and b"raftmq_dashboard_answers_total" in r.read()
        assert served_cert(spec, metrics) == spec.tls.cert("dashboard").read_text()
    finally:
        dash.terminate()
        dash.wait(timeout=30)


def test_rotate_node_certificates_one_at_a_time_zero_failed_sends(
    cluster: ClusterRunner,
) -> None:
    spec = cluster.spec
    assert spec.tls is not None
    wait_leader(spec)
    group = next(iter(spec.groups))
    nodes = [n.name for n in spec.groups[group]]
    old = {n: spec.tls.cert(n).read_bytes() for n in nodes}
    write_certs(spec.tls.dir, [CertRequest(n, ("127.0.0.1",)) for n in nodes], force=True)
    assert all(spec.tls.cert(n).read_bytes() != old[n] for n in nodes)
    failures: list[BaseException] = []
    sent = 0
    stop = threading.Event()

    def produce() -> None:
        nonlocal sent
        with Producer(spec.namesrv_addresses, send_timeout_ms=30_000, **tls_args(spec)) as p:
            while not stop.is_set():
                try:
                    p.send("secure", f"r{sent}".encode())
                    sent += 1
                except RaftMQError as exc:
                    failures.append(exc)
                time.sleep(0.01)

    t = threading.Thread(target=produce, daemon=True)
    t.start()
    try:
        # The producer runs before the rotation starts (on a loaded machine its TLS start could
        # outlast the whole rotation: 0 sent, nothing rotated under traffic).
        wait_until(lambda: sent >= 5 or failures, 30, "the producer's first sends")
        for n in nodes:
            cluster.kill(n, sig=15)  # SIGTERM: hands leadership off, as a rolling restart does
            cluster.start(n)
            wait_leader(spec)
            time.sleep(1.0)
    finally:
        stop.set()
        t.join(timeout=60)
    assert sent > 50, sent
    assert failures == [], failures[:3]
    # Each node now serves its new certificate (its HTTPS metrics port: same process identity).
    metrics = {p.name: p.metrics for p in spec.processes() if p.name in nodes}
    for n in nodes:
        assert served_cert(spec, metrics[n]) == spec.tls.cert(n).read_text(), n
