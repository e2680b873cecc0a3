"""[security.tls] of the cluster description, `raftmq cluster certs` and common/tls.py without a
cluster: what is refused at load (with the file named and the command that fixes it), what every
process is started with, and that the certificates made fit TLS on both ends."""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from raftmq.broker import server as broker_server
from raftmq.broker import settings as broker_settings
from raftmq.common import tls
from raftmq.common.errors import InvalidArgumentError
from raftmq.common.settings import SettingsError
from raftmq.ops.certs import CertRequest, CertsError, write_certs
from raftmq.ops.cli_cluster import security_warning
from raftmq.ops.cluster_spec import SpecError, local_description, parse
from tests.harness.procs import ROOT, free_ports


def description(tmp: Path, tls_table: str) -> str:
    return local_description(
        free_ports(7), tmp / "data", namesrvs=1, controllers=0, extra=tls_table, metrics=False
    )


@pytest.fixture
def certs(tmp_path: Path) -> Path:
    d = tmp_path / "certs"
    write_certs(d, [CertRequest("broker-a-n0", ("node0.example",)), CertRequest("client", ())])
    return d


@pytest.fixture(autouse=True)
def no_installed_tls() -> Iterator[None]:
    yield
    tls.uninstall()  # parse_role_args installs the process's material: not across tests


def test_open_cluster_warning_names_what_is_off(tmp_path: Path) -> None:
    """One line for both halves of [security]: none when TLS and auth are both on."""
    tls_on = f"[security.tls]\nenabled=true\ndir='{tmp_path / 'certs'}'\n"
    auth_on = "[security.auth]\nenabled=true\nadmin_access_key='admin'\n"

    def warning(extra: str) -> str | None:
        text = local_description(
            free_ports(7), tmp_path / "data", namesrvs=1, controllers=1, nodes_per_group=2,
            extra=extra,
        )  # fmt: skip
        return security_warning(parse(text))

    assert warning(tls_on + auth_on) is None
    only_tls = warning(auth_on)
    assert only_tls is not None and "TLS is off" in only_tls and "auth is off" not in only_tls
    both = warning("")
    assert both is not None and "TLS is off" in both and "auth is off" in both


def test_tls_section_off_or_absent_is_open(tmp_path: Path) -> None:
    for table in ("", "[security.tls]\nenabled=false\n", "[security.auth]\nenabled=false\n"):
        spec = parse(description(tmp_path, table))
        assert spec.tls is None
        assert security_warning(spec) is not None and "the cluster is open" in str(
            security_warning(spec)
        )
        assert not any("--tls-ca" in p.argv for p in spec.processes())


@pytest.mark.parametrize(
    ("table", "fragment"),
    [
        ("[security.tls]\nenabled=true\ncert_dir='x'\n", "unknown [security.tls] key(s) cert_dir"),
        ("[security.tls]\nenabled='yes'\n", "security.tls.enabled must be true or false"),
        ("[security.tls]\nenabled=true\nrequire_client_cert=1\n", "require_client_cert"),
        ("[security.tls]\nenabled=true\nproxy_require_client_cert='no'\n", "proxy_require"),
        ("[security.other]\nx=1\n", "unknown [security] table(s) other"),
        ("security = 3\n", "[security] must be a table"),
    ],
)
def test_bad_tls_section_is_refused_by_name(tmp_path: Path, table: str, fragment: str) -> None:
    text = description(tmp_path, "")
    if not table.startswith("["):  # a top-level key must come before the first table
        text = table + text
        table = ""
    with pytest.raises(SpecError) as err:
        parse(text + table)
    assert fragment in str(err.value)


def test_every_process_gets_its_own_certificate_flags(tmp_path: Path) -> None:
    d = tmp_path / "certs"
    spec = parse(
        description(
            tmp_path, f"[security.tls]\nenabled=true\ndir='{d}'\nrequire_client_cert=true\n"
        )
    )
    assert spec.tls is not None
    warning = security_warning(spec)  # TLS on, auth off: the line names only what is off
    assert warning is not None and "auth is off" in warning and "TLS is off" not in warning
    for p in spec.processes():
        argv = list(p.argv)
        assert argv[argv.index("--tls-ca") + 1] == str(d / "ca.crt")
        assert argv[argv.index("--tls-cert") + 1] == str(d / f"{p.name}.crt")
        assert argv[argv.index("--tls-key") + 1] == str(d / f"{p.name}.key")
        assert argv[argv.index("--tls-raft-key") + 1] == str(d / "raft.key")
        assert "--tls-require-client-cert" in argv
    with pytest.raises(SpecError) as err:
        spec.check_tls_files()
    assert str(d / "ca.crt") in str(err.value) and "raftmq cluster certs" in str(err.value)


def test_certs_refuse_to_overwrite_and_rotate_under_the_same_ca(tmp_path: Path) -> None:
    d = tmp_path / "c"
    reqs = [CertRequest("n0", ("10.1.2.3", "node0.example"))]
    write_certs(d, reqs, days=3)
    ca, leaf, raft = (d / "ca.crt").read_bytes(), (d / "n0.crt").read_bytes(), (d / "raft.key")
    with pytest.raises(CertsError) as err:
        write_certs(d, reqs)
    assert "--force" in str(err.value) and str(d / "n0.crt") in str(err.value)
    raft_secret = raft.read_bytes()
    write_certs(d, reqs, force=True)  # rotation: new leaf, same CA, same Raft secret
    assert (d / "ca.crt").read_bytes() == ca and (d / "n0.crt").read_bytes() != leaf
    assert raft.read_bytes() == raft_secret
    assert oct((d / "n0.key").stat().st_mode & 0o777) == "0o600"
    cert = x509.load_pem_x509_certificate((d / "n0.crt").read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(san.get_values_for_type(x509.DNSName)) == {"node0.example", "localhost"}
    assert {str(a) for a in san.get_values_for_type(x509.IPAddress)} == {"10.1.2.3", "127.0.0.1"}
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(eku) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    ctx = ssl.create_default_context(cafile=str(d / "ca.crt"))  # the chain verifies
    ctx.load_cert_chain(d / "n0.crt", d / "n0.key")
    write_certs(d, reqs, force=True, new_ca=True)
    assert (d / "ca.crt").read_bytes() != ca
    with pytest.raises(CertsError):
        write_certs(d, reqs, days=0, force=True)


def test_tls_load_names_the_missing_file_and_the_fix(tmp_path: Path, certs: Path) -> None:
    with pytest.raises(SettingsError) as err:
        tls.load({"ca": str(tmp_path / "nope.crt")}, environ={})
    assert str(tmp_path / "nope.crt") in str(err.value)
    assert "raftmq cluster certs" in str(err.value)
    with pytest.raises(SettingsError, match="both a certificate and its key"):
        tls.load({"ca": str(certs / "ca.crt"), "cert": str(certs / "client.crt")}, environ={})
    with pytest.raises(SettingsError, match="do not fit together"):  # someone else's key
        tls.load(
            {
                "ca": str(certs / "ca.crt"),
                "cert": str(certs / "client.crt"),
                "key": str(certs / "broker-a-n0.key"),
            },
            environ={},
        )
    with pytest.raises(SettingsError, match="without a CA"):
        tls.load({"cert": str(certs / "client.crt")}, environ={})
    assert tls.load({}, environ={}) is None
    env = {"RAFTMQ_TLS_CA": str(certs / "ca.crt")}
    loaded = tls.load(environ=env)
    assert loaded is not None and loaded.cert_pem is None and loaded.client_context()
    with pytest.raises(InvalidArgumentError):  # the SDK's arguments: a typed error
        tls.client_tls(ca=str(tmp_path / "nope.crt"))


def test_a_role_installs_its_tls_and_the_raft_port_uses_the_shared_secret(certs: Path) -> None:
    config, overrides = broker_server.parse_args(
        [
            "--node-id", "n0", "--members", "n0=127.0.0.1:1/127.0.0.1:2",
            "--tls-ca", str(certs / "ca.crt"), "--tls-cert", str(certs / "broker-a-n0.crt"),
            "--tls-key", str(certs / "broker-a-n0.key"), "--tls-raft-key", str(certs / "raft.key"),
        ]
    )  # fmt: skip
    installed = tls.process_tls()
    assert installed is not None and installed.cert_file == certs / "broker-a-n0.crt"
    s = broker_settings.load(config, overrides, environ={})
    assert s.raft_config().password == (certs / "raft.key").read_text().strip()


def test_cluster_certs_command(tmp_path: Path) -> None:
    d = tmp_path / "certs"
    spec = tmp_path / "cluster.toml"
    spec.write_text(description(tmp_path, f"[security.tls]\nenabled=true\ndir='{d}'\n"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAFTMQ_TLS_")}
    env["PYTHONPATH"] = str(ROOT)

    def certs_cmd(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "raftmq.ops.cli", "cluster", "certs", "--spec", str(spec),
             "--days", "5", *extra],
            env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip

    first = certs_cmd()
    assert first.returncode == 0, first.stdout + first.stderr
    parse(spec.read_text()).check_tls_files()  # everything the processes need is there
    again = certs_cmd()
    assert again.returncode == 2 and "--force" in again.stderr and "Traceback" not in again.stderr
    assert certs_cmd("--force").returncode == 0


def test_the_proxy_port_may_be_server_only_under_mutual_tls(tmp_path: Path) -> None:
    """Issue 27: TLS server-only or mutual per port; the proxy's (the official RocketMQ 5
    clients have no certificate) may differ from the cluster's, in compose too."""
    from raftmq.ops.compose import compose_yaml

    def mutual_by_role(table: str) -> dict[str, set[bool]]:
        text = local_description(
            free_ports(8), tmp_path / "data", namesrvs=1, controllers=0, proxies=1,
            extra=f"[security.tls]\nenabled=true\ndir='certs'\n{table}", metrics=False,
        )  # fmt: skip
        spec = parse(text)
        out: dict[str, set[bool]] = {}
        for p in spec.processes():
            out.setdefault(p.role, set()).add("--tls-require-client-cert" in p.argv)
        compose = compose_yaml(spec)
        proxy = compose.split("  proxy-0:\n", 1)[1].split("\n  ", 4)
        command = next(line for line in proxy if line.startswith("  command:"))
        assert ("--tls-require-client-cert" in command) == out["proxy"].pop(), command
        out["proxy"] = {"--tls-require-client-cert" in command}
        return out

    split = mutual_by_role("require_client_cert=true\nproxy_require_client_cert=false\n")
    assert split == {"namesrv": {True}, "broker": {True}, "proxy": {False}}
    assert mutual_by_role("require_client_cert=true\n")["proxy"] == {True}  # default: as all
    only_proxy = mutual_by_role("proxy_require_client_cert=true\n")
    assert only_proxy == {"namesrv": {False}, "broker": {False}, "proxy": {True}}


def test_compose_mounts_the_certificates_and_points_every_process_at_them(tmp_path: Path) -> None:
    from raftmq.ops.compose import compose_yaml

    spec = parse(description(tmp_path, "[security.tls]\nenabled=true\ndir='certs'\n"))
    text = compose_yaml(spec)
    services = [p.name for p in spec.processes()]
    for name in services:
        block = text.split(f"  {name}:\n", 1)[1].split("\n  ", 4)
        command = next(line for line in block if line.startswith("  command:"))
        assert f'"--tls-cert", "/certs/{name}.crt"' in command
        assert '"--tls-ca", "/certs/ca.crt"' in command
    assert text.count('"./certs:/certs:ro"') == len(services)
