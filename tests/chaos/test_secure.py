"""The secure chaos scenario's pure parts: the runner's description with mutual TLS on, the
certificates it makes (with `raftmq cluster certs`'s code) for the namespace IPs, and the
workload's client environment. A certificate that does not name a process's namespace IP would
fail every connection to it: the handshake below is the one a client makes to that IP."""

from __future__ import annotations

import ipaddress
import ssl
from pathlib import Path

import pytest
from cryptography import x509

from raftmq.chaos.runner import (
    CHAOS_CLUSTER,
    RunError,
    RunPaths,
    client_material,
    client_tls_env,
    make_certs,
    secure_spec,
)
from raftmq.chaos.scenarios import LEADER, Kind, by_name, ci_set
from raftmq.common import tls
from raftmq.ops.certs import cert_requests
from raftmq.ops.cluster_spec import ClusterSpec, load


def _namespaced(tmp_path: Path) -> ClusterSpec:
    """The chaos description as the runner has it once every process has its namespace IP."""
    spec = secure_spec(load(CHAOS_CLUSTER), RunPaths(tmp_path).certs)
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


def test_workload_env_is_the_client_certificate(tmp_path: Path) -> None:
    spec = _namespaced(tmp_path)
    assert spec.tls is not None
    env = client_tls_env(spec)
    assert env == {
        "RAFTMQ_TLS_CA": str(spec.tls.ca),
        "RAFTMQ_TLS_CERT": str(tmp_path / "certs" / "client.crt"),
        "RAFTMQ_TLS_KEY": str(tmp_path / "certs" / "client.key"),
    }
    plain = load(CHAOS_CLUSTER)
    assert client_tls_env(plain) == {} and client_material(plain) is None
    with pytest.raises(RunError, match=r"\[security\.tls\]"):
        make_certs(plain)
