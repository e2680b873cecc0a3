"""The cost of authentication and authorization (issue 19) on W1 and W2: the same local cluster
(a NameServer carrying an embedded controller, two broker groups of three nodes) run twice, with
[security.auth] off and on, the SDK signing with the admin's keys in the second run; plus the
per-call cost of the guard's pieces, measured in this process. Writes bench/results/auth.json.

Run: `.venv/bin/python bench/auth_bench.py [--seconds 10] [--sync-sends 2000]`
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import timeit
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from raftmq.client.admin import Admin  # noqa: E402
from raftmq.common.acl import Acl, Action, User, UserType, parse_entries  # noqa: E402
from raftmq.common.auth import Credentials, Signer  # noqa: E402
from raftmq.common.auth_guard import AuthConfig, Guard  # noqa: E402
from raftmq.common.pb import broker_pb2  # noqa: E402
from tests.harness.procs import (  # noqa: E402
    Cluster,
    GroupLayout,
    broker_procs,
    free_ports,
    namesrv_proc,
    wait_until,
)

RESULTS = ROOT / "bench" / "results" / "auth.json"
ADMIN = Credentials("bench-admin", "bench-admin-secret")
AUTH = [
    "--auth-enabled", "--auth-admin-access-key", ADMIN.access_key,
    "--auth-admin-secret-key", ADMIN.secret_key,
]  # fmt: skip

_spec = importlib.util.spec_from_file_location("broker_bench", ROOT / "bench" / "broker_bench.py")
assert _spec is not None and _spec.loader is not None
broker_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(broker_bench)


def start(tmp: Path, secure: bool) -> Cluster:
    ns_port, ctl_raft, *rest = free_ports(20)
    ns_addr = f"127.0.0.1:{ns_port}"
    auth = AUTH if secure else []
    ns = namesrv_proc(
        tmp,
        "ns0",
        ns_port,
        [
            "--enable-controller", "--controller-node-id", "c0",
            "--controller-raft-address", f"127.0.0.1:{ctl_raft}",
            "--controller-data-dir", str(tmp / "ctl"), "--controller-namesrv-addresses", ns_addr,
            "--no-controller-balance-leaders", *auth,
            *("--controller" + a[1:] if a.startswith("--") else a for a in auth),
        ],
    )  # fmt: skip
    groups = {}
    for i, g in enumerate(("broker-a", "broker-b")):  # as broker_bench's cluster: two groups
        chunk = rest[9 * i : 9 * i + 9]
        layout = GroupLayout(g, chunk[:3], chunk[3:6], chunk[6:])
        extra = ["--controller-addresses", ns_addr, *auth]
        groups[g] = (layout, broker_procs(tmp, layout, [ns_addr], extra))
    c = Cluster(tmp, [ns], [ns_addr], groups)
    ns.start("namesrv.started")
    for _, ps in groups.values():
        for p in ps:
            p.start("broker.started")
    with Admin(ns_addr) as admin:
        wait_until(lambda: len([g for g in admin.groups() if g.leader_address]) == 2, 60, "leaders")
    return c


def micro(results: list[dict[str, Any]]) -> None:
    """The guard's per-request pieces, in microseconds per call (this process, one thread)."""
    alice = User("alice", "alice-secret")
    acl = Acl(
        1, {"alice": alice}, {"alice": parse_entries(["Topic:orders*=Pub,Sub", "Group:g=Sub"])}
    )
    guard = Guard(AuthConfig(True, User("a", "admin-secret", UserType.SUPER)), lambda: acl)
    signer = Signer(Credentials("alice", "alice-secret"))
    md = signer.metadata()
    guard.authenticate_metadata(md)
    pull = broker_pb2.PullMessageRequest(topic="orders-eu", consumer_group="g")
    n = 20_000

    def us(stmt: Any) -> float:
        return round(min(timeit.repeat(stmt, number=n, repeat=3)) / n * 1e6, 3)

    fresh = Guard(AuthConfig(True, User("a", "admin-secret", UserType.SUPER)), lambda: acl)
    rec = {
        "name": "auth_micro",
        "sign_metadata_cached_us": us(signer.metadata),
        "authenticate_cached_us": us(lambda: guard.authenticate_metadata(md)),
        "authenticate_uncached_us": us(
            lambda: (fresh._caches[2].clear(), fresh.authenticate_metadata(md))
        ),
        "check_send_topic_cached_us": us(
            lambda: guard.check_topic("alice", Action.PUB, "orders-eu")
        ),
        "check_pull_request_cached_us": us(
            lambda: guard.check_path("alice", "/raftmq.v1.Broker/PullMessage", pull)
        ),
        "hello_auth_verify_us": us(lambda: fresh.authenticate_hello(*signer.hello_auth())),
    }
    broker_bench.emit(results, rec)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--inflight", type=int, default=64)
    ap.add_argument("--sync-sends", type=int, default=2000)
    ap.add_argument("--only", default="micro,off,on", help="and the order of off and on")
    args = ap.parse_args()
    results: list[dict[str, Any]] = []
    if "micro" in args.only.split(","):
        micro(results)
    for mode in [m for m in args.only.split(",") if m in ("off", "on")]:
        if mode == "on":  # the SDK (producer, admin) signs with these
            os.environ["RAFTMQ_ACCESS_KEY"] = ADMIN.access_key
            os.environ["RAFTMQ_SECRET_KEY"] = ADMIN.secret_key
        else:
            os.environ.pop("RAFTMQ_ACCESS_KEY", None)
            os.environ.pop("RAFTMQ_SECRET_KEY", None)
        with tempfile.TemporaryDirectory(prefix="authbench-", dir=ROOT / "bench") as tmp:
            cluster = start(Path(tmp), mode == "on")
            try:
                out: list[dict[str, Any]] = []  # broker_bench prints each as it comes
                broker_bench.w1(out, cluster, args.seconds, args.inflight)
                broker_bench.w2(out, cluster, args.sync_sends)
                results += [{**r, "name": f"{r['name']}_auth_{mode}"} for r in out]
            finally:
                cluster.close()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    old = json.loads(RESULTS.read_text()) if RESULTS.exists() else []
    RESULTS.write_text(json.dumps([*old, *results], indent=1) + "\n")  # runs accumulate
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
