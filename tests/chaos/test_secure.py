"""The secure chaos scenario's pure parts: the runner's description with mutual TLS and auth on,
the certificates it makes (with `raftmq cluster certs`'s code) for the namespace IPs, the
workload's client environment and its user's policy. A certificate that does not name a
process's namespace IP would fail every connection to it: the handshake below is the one a
client makes to that IP."""

from __future__ import annotations

import ipaddress
import os
import ssl
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from cryptography import x509

from raftmq.chaos.runner import (
    ADMIN_ACCESS_KEY,
    CHAOS_CLUSTER,
    CONSUMER_GROUP,
    TOPIC,
    WORKLOAD_POLICY,
    WORKLOAD_USER,
    RunError,
    RunKeys,
    RunPaths,
    _harness_env,
    client_env,
    client_material,
    make_certs,
    secure_spec,
)
from raftmq.chaos.scenarios import LEADER, Kind, by_name, ci_set
from raftmq.common import tls
from raftmq.common.acl import Acl, Action, Decision, authorize, make_user, parse_entries, topic
from raftmq.common.rpc_acl import RULES
from raftmq.ops.certs import cert_requests
from raftmq.ops.cluster_spec import ClusterSpec, load

KEYS = RunKeys.new()


def _namespaced(tmp_path: Path) -> ClusterSpec:
    """The chaos description as the runner has it once every process has its namespace IP."""
    spec = secure_spec(load(CHAOS_CLUSTER), RunPaths(tmp_path).certs, KEYS)
    names = [p.name for p in spec.processes()]
    return spec.with_hosts({n: f"10.77.0.{i + 2}" for i, n in enumerate(names)})


def _sans(path: Path) -> set[str]:
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return {str(v) for v in san.get_values_for_type(x509.IPAddress)} | set(
        san.get_values_for_type(x509.DNSName)
    )


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext, host: str) -> None:
    """A TLS handshake over memory buffers (no sockets): raises ssl.SSLError when refused."""
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    c = client.wrap_bio(c_in, c_out, server_hostname=host)
    s = server.wrap_bio(s_in, s_out, server_side=True)
    done = {"c": False, "s": False}
    for _ in range(10):
        for name, end, out, peer_in in (("c", c, c_out, s_in), ("s", s, s_out, c_in)):
            if not done[name]:
                try:
                    end.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
            peer_in.write(out.read())
        if all(done.values()):
            return
    raise AssertionError("handshake did not finish")


def test_the_scenario_is_leader_kill_with_security_on_and_not_in_ci() -> None:
    s = by_name("secure-leader-kill")
    assert s.secure and not s.ci and s not in ci_set()
    (f,) = s.schedule(1).faults
    assert f.kind is Kind.KILL and f.target == LEADER and f.majority_remains
    assert not by_name("leader-kill").secure


def test_secure_spec_turns_mutual_tls_on_in_the_runs_directory(tmp_path: Path) -> None:
    spec = _namespaced(tmp_path)
    assert spec.tls is not None and spec.tls.require_client_cert
    assert spec.tls.dir == tmp_path / "certs" and spec.tls.ca == tmp_path / "certs" / "ca.crt"
    for p in spec.processes():
        assert "--tls-require-client-cert" in p.argv
        assert p.argv[p.argv.index("--tls-cert") + 1] == str(tmp_path / "certs" / f"{p.name}.crt")


def test_cert_requests_name_each_process_namespace_ip(tmp_path: Path) -> None:
    spec = _namespaced(tmp_path)
    hosts = {r.name: r.hosts for r in cert_requests(spec)}
    assert set(hosts) == {p.name for p in spec.processes()} | {"client", "dashboard"}
    for p in spec.processes():
        assert ipaddress.ip_address(p.host).is_private and p.host != "127.0.0.1"
        assert hosts[p.name] == (p.host, p.name)
    assert hosts["client"] == ("client",)


def test_made_certificates_pass_a_handshake_to_the_namespace_ip_with_mutual_tls(
    tmp_path: Path,
) -> None:
    spec = _namespaced(tmp_path)
    assert spec.tls is not None
    written = make_certs(spec)
    assert spec.tls.ca in written and spec.tls.raft_key in written
    node = next(p for p in spec.processes() if p.name == "broker-a-n1")
    assert node.host in _sans(spec.tls.cert(node.name))
    server = tls.load(
        {
            "ca": str(spec.tls.ca),
            "cert": str(spec.tls.cert(node.name)),
            "key": str(spec.tls.key(node.name)),
            "require_client_cert": True,
        },
        environ={},
    )
    client = client_material(spec)
    assert server is not None and client is not None and client.cert_file is not None
    _handshake(server.server_context(), client.client_context(), node.host)
    other = next(p for p in spec.processes() if p.name == "broker-a-n2")
    with pytest.raises(ssl.SSLCertVerificationError):  # n1's certificate does not name n2's IP
        _handshake(server.server_context(), client.client_context(), other.host)
    no_cert = tls.load({"ca": str(spec.tls.ca)}, environ={})
    assert no_cert is not None
    with pytest.raises(ssl.SSLError):  # mutual TLS: a client without a certificate is refused
        _handshake(server.server_context(), no_cert.client_context(), node.host)


def test_workload_env_is_the_client_certificate_and_the_users_keys(tmp_path: Path) -> None:
    spec = _namespaced(tmp_path)
    assert spec.tls is not None
    env = client_env(spec, KEYS.user)
    assert env == {
        "RAFTMQ_TLS_CA": str(spec.tls.ca),
        "RAFTMQ_TLS_CERT": str(tmp_path / "certs" / "client.crt"),
        "RAFTMQ_TLS_KEY": str(tmp_path / "certs" / "client.key"),
        "RAFTMQ_ACCESS_KEY": WORKLOAD_USER,
        "RAFTMQ_SECRET_KEY": KEYS.user.secret_key,
    }
    plain = load(CHAOS_CLUSTER)
    assert client_env(plain) == {} and client_material(plain) is None
    with pytest.raises(RunError, match=r"\[security\.tls\]"):
        make_certs(plain)


def test_auth_is_on_with_the_runs_admin_in_every_process(tmp_path: Path) -> None:
    spec = _namespaced(tmp_path)
    other = RunKeys.new()
    assert other.admin.secret_key != KEYS.admin.secret_key  # new secrets each run
    assert KEYS.admin.secret_key not in repr(KEYS)
    for p in spec.processes():
        argv = list(p.argv)
        assert "--auth-enabled" in argv
        assert argv[argv.index("--auth-admin-access-key") + 1] == ADMIN_ACCESS_KEY
        # issue 27: the secret by environment, never on the command line (`ps` shows argv)
        assert "--auth-admin-secret-key" not in argv
        assert not any(KEYS.admin.secret_key in a for a in argv)
        assert ("RAFTMQ_ADMIN_SECRET_KEY", KEYS.admin.secret_key) in p.env
    assert WORKLOAD_USER != ADMIN_ACCESS_KEY


def test_harness_env_is_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAFTMQ_ACCESS_KEY", "someone")
    monkeypatch.delenv("RAFTMQ_SECRET_KEY", raising=False)
    with _harness_env({"RAFTMQ_ACCESS_KEY": "chaos-admin", "RAFTMQ_SECRET_KEY": "s"}):
        assert os.environ["RAFTMQ_ACCESS_KEY"] == "chaos-admin"
        assert os.environ["RAFTMQ_SECRET_KEY"] == "s"
    assert os.environ["RAFTMQ_ACCESS_KEY"] == "someone"
    assert "RAFTMQ_SECRET_KEY" not in os.environ


def _allowed(acl: Acl, method: str, req: Any) -> bool:
    """Every need of the method's rule granted (a set of actions: any one of them)."""
    for action, resource in RULES[method](req):
        actions = action if isinstance(action, frozenset) else {action}
        if not any(authorize(acl, WORKLOAD_USER, a, resource) is Decision.ALLOW for a in actions):
            return False
    return True


def test_workload_policy_lets_it_send_and_consume_and_nothing_more() -> None:
    acl = Acl(
        1,
        {WORKLOAD_USER: make_user(WORKLOAD_USER, "secret")},
        {WORKLOAD_USER: parse_entries(WORKLOAD_POLICY)},
    )
    ns = SimpleNamespace
    sub = ns(topic=TOPIC, consumer_group=CONSUMER_GROUP)
    served = {
        "/raftmq.v1.NameServer/GetRouteInfoByTopic": ns(topic=TOPIC),
        "/raftmq.v1.Broker/SendMessage": ns(topic=TOPIC),
        "/raftmq.v1.Broker/SendBatches": ns(batches=[ns(topic=TOPIC)]),
        "/raftmq.v1.Broker/PullMessage": sub,
        "/raftmq.v1.Broker/QueryOffset": sub,
        "/raftmq.v1.Broker/CommitOffset": ns(
            consumer_group=CONSUMER_GROUP, offsets=[ns(topic=TOPIC)]
        ),
        "/raftmq.v1.Broker/Heartbeat": ns(consumer_group=CONSUMER_GROUP, topics=[TOPIC]),
    }
    for method, req in served.items():
        assert _allowed(acl, method, req), method
    refused = {
        "/raftmq.v1.Broker/SendMessage": ns(topic="payments"),
        "/raftmq.v1.Broker/PullMessage": ns(topic=TOPIC, consumer_group="other-group"),
        "/raftmq.v1.Broker/GetBrokerStatus": ns(),
        "/raftmq.v1.Broker/ResetOffsets": sub,
    }
    for method, req in refused.items():
        assert not _allowed(acl, method, req), method
    assert authorize(acl, WORKLOAD_USER, Action.CREATE, topic(TOPIC)) is Decision.DENY
