"""The RocketMQ 5 API over TLS: the official client (PyPI `rocketmq-python-client`, its
`tls_enable`, trusting the development CA through gRPC's GRPC_DEFAULT_SSL_ROOTS_FILE_PATH) sends
through a raftmq proxy of a cluster with [security.tls] (server certificates: the official client
has no client-certificate setting), and the message reaches raftmq's own consumer over TLS."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftmq.client.admin import Admin
from raftmq.client.consumer_pull import PullConsumer
from raftmq.client.offsets import StartFrom
from raftmq.ops.certs import CertRequest, write_certs
from raftmq.ops.cluster_runner import ClusterRunner
from raftmq.ops.cluster_spec import ClusterSpec, local_description, parse
from tests.harness.procs import free_ports

SEND = """
import sys
from rocketmq import ClientConfiguration, Credentials, Message, Producer
p = Producer(ClientConfiguration(sys.argv[1], Credentials(), request_timeout=10), ("rmq5-tls",),
             tls_enable=True)
p.startup()
try:
    m = Message()
    m.topic = "rmq5-tls"
    m.body = b"over TLS from RocketMQ 5"
    print("SENT", p.send(m).message_id, flush=True)
finally:
    p.shutdown()
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterRunner]:
    tmp = tmp_path_factory.mktemp("tls-proxy")
    certs = tmp / "certs"
    extra = f"[security.tls]\nenabled=true\ndir='{certs}'\n"
    text = local_description(
        free_ports(8), tmp / "data", namesrvs=1, controllers=0, proxies=1, extra=extra
    )
    spec = parse(text)
    write_certs(certs, [CertRequest(n, ("127.0.0.1",)) for n in spec.tls_names()], days=2)
    runner = ClusterRunner(spec)
    try:
        runner.start_all()
        yield runner
    finally:
        runner.stop_all()


def tls_args(spec: ClusterSpec) -> dict[str, str]:
    assert spec.tls is not None
    return {
        "tls_ca": str(spec.tls.ca),
        "tls_cert": str(spec.tls.cert("client")),
        "tls_key": str(spec.tls.key("client")),
    }


def test_official_client_sends_through_the_tls_proxy(
    cluster: ClusterRunner, tmp_path: Path
) -> None:
    spec = cluster.spec
    assert spec.tls is not None
    with Admin(spec.namesrv_addresses, **tls_args(spec)) as admin:
        deadline = time.monotonic() + 60
        while not (admin.groups() and all(g.leader_address for g in admin.groups())):
            assert time.monotonic() < deadline, "no leader"
            time.sleep(0.2)
        admin.create_topic("rmq5-tls", queues=2)
    script = tmp_path / "send.py"
    script.write_text(SEND)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAFTMQ_")}
    env["GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"] = str(spec.tls.ca)
    endpoint = str(spec.proxies[0])
    sent = ""
    deadline = time.monotonic() + 90
    while not sent and time.monotonic() < deadline:  # the proxy learns the route within seconds
        out = subprocess.run(
            [sys.executable, str(script), endpoint],
            env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        sent = next((ln for ln in out.stdout.splitlines() if ln.startswith("SENT ")), "")
        if not sent:
            time.sleep(1.0)
    assert sent, out.stdout[-2000:] + out.stderr[-3000:]
    got: list[bytes] = []
    with PullConsumer(
        spec.namesrv_addresses, "g-rmq5", start_from=StartFrom.EARLIEST, **tls_args(spec)
    ) as c:
        c.subscribe("rmq5-tls")
        deadline = time.monotonic() + 60
        while not got and time.monotonic() < deadline:
            got += [m.body for m in c.poll(timeout_ms=1000)]
    assert got == [b"over TLS from RocketMQ 5"]
