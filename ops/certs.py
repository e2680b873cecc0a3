"""`raftmq cluster certs`: a development CA and one certificate per process of a cluster
description (plus `client` for the SDK and CLI, and `dashboard`), made with `cryptography`.

Development only: the CA key sits beside the certificates. It never overwrites a file unless
asked (force), and keeps an existing CA so that certificates can be rotated under it.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from raftmq.ops.cluster_spec import ClusterSpec, SpecError

CA_CERT = "ca.crt"
CA_KEY = "ca.key"
RAFT_KEY = "raft.key"
CLIENT = "client"
DASHBOARD = "dashboard"
DEFAULT_DAYS = 365


class CertsError(SpecError):
    """A certificate cannot be made; the message says which file and what to do."""


@dataclass(frozen=True, slots=True)
class CertRequest:
    """One leaf certificate: files <name>.crt/.key, valid for these host names and IPs."""

    name: str
    hosts: tuple[str, ...]


_CA_USAGE = dict.fromkeys(
    ("content_commitment", "key_encipherment", "data_encipherment", "key_agreement",
     "encipher_only", "decipher_only"), False
) | {"digital_signature": True, "key_cert_sign": True, "crl_sign": True}  # fmt: skip


def cert_requests(spec: ClusterSpec) -> list[CertRequest]:
    """One request per name of spec.tls_names(): a process's certificate names its host (an IP
    or a name) and its process name (compose and network namespaces use it as the host name);
    every leaf also names 127.0.0.1 and localhost (_san). `raftmq cluster certs` and the chaos
    runner (each process on its own namespace IP) both make their certificates from this."""
    hosts = {p.name: p.host for p in spec.processes()}
    if spec.dashboard is not None:
        hosts["dashboard"] = spec.dashboard.host
    return [
        CertRequest(name, (hosts[name], name) if name in hosts else (name,))
        for name in spec.tls_names()
    ]


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _san(hosts: Iterable[str]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for h in dict.fromkeys([*hosts, "127.0.0.1", "localhost"]):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    return x509.SubjectAlternativeName(names)


def make_ca(days: int, now: datetime.datetime) -> tuple[bytes, bytes]:
    key = _key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "raftmq development CA")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)


def make_leaf(
    req: CertRequest, ca_cert_pem: bytes, ca_key_pem: bytes, days: int, now: datetime.datetime
) -> tuple[bytes, bytes]:
    """A certificate for both ends of a connection: nodes serve and also call each other."""
    ca_cert = x509.load_pem_x509_certificate(ca_cert_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise CertsError("the CA key is not an EC key made by `raftmq cluster certs`")
    key = _key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, req.name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_san(req.hosts), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)


def _write(path: Path, data: bytes, private: bool) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)  # a restarting node reads the old file or the new one, never half


def write_certs(
    out_dir: Path,
    requests: Sequence[CertRequest],
    *,
    days: int = DEFAULT_DAYS,
    force: bool = False,
    new_ca: bool = False,
    now: datetime.datetime | None = None,
) -> list[Path]:
    """Write the CA (kept when it exists, unless new_ca), the Raft secret and each leaf pair;
    the paths written. Existing leaf files without `force`: CertsError naming them."""
    if days < 1:
        raise CertsError("--days must be at least 1")
    now = now or datetime.datetime.now(datetime.UTC)
    out_dir.mkdir(parents=True, exist_ok=True)
    leaf_files = [out_dir / f"{r.name}.{ext}" for r in requests for ext in ("crt", "key")]
    existing = [p for p in leaf_files if p.exists()]
    if existing and not force:
        shown = ", ".join(str(p) for p in existing[:3]) + (" ..." if len(existing) > 3 else "")
        raise CertsError(
            f"{shown} already exist; pass --force to replace them (the CA is kept unless --new-ca)"
        )
    written: list[Path] = []
    ca_crt, ca_key = out_dir / CA_CERT, out_dir / CA_KEY
    if new_ca or not (ca_crt.exists() and ca_key.exists()):
        if (ca_crt.exists() or ca_key.exists()) and not force:
            raise CertsError(f"{ca_crt} or {ca_key} already exists; pass --force to replace")
        cert_pem, key_pem = make_ca(days, now)
        _write(ca_key, key_pem, private=True)
        _write(ca_crt, cert_pem, private=False)
        written += [ca_crt, ca_key]
    ca_cert_pem, ca_key_pem = ca_crt.read_bytes(), ca_key.read_bytes()
    raft = out_dir / RAFT_KEY
    if not raft.exists():  # shared by every node; rotating it needs a whole-cluster restart
        _write(raft, secrets.token_urlsafe(32).encode() + b"\n", private=True)
        written.append(raft)
    for r in requests:
        cert_pem, key_pem = make_leaf(r, ca_cert_pem, ca_key_pem, days, now)
        _write(out_dir / f"{r.name}.key", key_pem, private=True)
        _write(out_dir / f"{r.name}.crt", cert_pem, private=False)
        written += [out_dir / f"{r.name}.crt", out_dir / f"{r.name}.key"]
    return written
