"""raftmq in ../shared/peerbench, driven through its SDK as users drive it.

One NameServer and one broker group of three Raft nodes (raftmq's own Raft core; ASYNC_FLUSH:
group fsync every 5 ms), a topic of `partitions` queues; an acknowledgement is
the SDK's send result, which the leader gives after the majority commit. Message `seq` goes to queue
`seq % partitions` (the harness's rule); the consumer is a PullConsumer of a fresh group from the
earliest offset that commits after each batch.
Run from the project root (README of peerbench):

    PYTHONPATH=. ../shared/peerbench/bench.sh run \\
        --peers nats,redis-repl,bench.peer_adapter:RaftMQ --workloads W1,W2,W3,W4 ...

Options (`--opt k=v`): `api=aio|threaded` (the SDK face), `tls=0|1|mutual`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from peerbench.adapter import Adapter, AdapterError
from peerbench.common import LOOPBACK, Proc, free_port, wait_port

from raftmq import Admin, Producer, PullConsumer, StartFrom
from raftmq.client.aio import AsyncProducer
from raftmq.common.pb import common_pb2
from raftmq.common.types import QueueRef
from raftmq.ops.procs import PASSED_ENV

ROOT = Path(__file__).resolve().parent.parent
# The harness's venv has the SDK's two dependencies only; the servers run on the project's.
SERVER_PYTHON = os.environ.get("RAFTMQ_SERVER_PYTHON") or str(
    ROOT / ".venv" / "bin" / "python"
    if (ROOT / ".venv" / "bin" / "python").exists()
    else sys.executable
)
TOPIC = "bench"
GROUP = "broker-a"
START_TIMEOUT_S = 60.0
PRELOAD_BATCH = 512  # messages per send_batch while preloading W3's backlog
PRELOAD_THREADS = 4


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAFTMQ_") or k in PASSED_ENV}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


async def _until(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if await asyncio.to_thread(check):
                return
        except Exception:  # a node not up yet: try again until the deadline
            pass
        await asyncio.sleep(0.2)
    raise AdapterError(f"raftmq: timed out after {timeout_s} s waiting for {what}")


class RaftMQ(Adapter):
    name = "raftmq"
    replicas = 3

    def __init__(self, partitions: int = 8, body_size: int = 1024, **opts: Any) -> None:
        super().__init__(partitions, body_size, **opts)
        self.variant = (
            f"1 NameServer + one broker group of 3 Raft nodes, ASYNC_FLUSH, "
            f"ack after the majority commit, topic of {partitions} queues"
        )
        self.procs: dict[str, Proc] = {}
        self.grpc: dict[str, str] = {}  # node id -> gRPC address
        self.namesrv = ""
        self.producer: Producer | None = None
        # "aio": the SDK's asyncio face (AsyncProducer.send_future, as an asyncio user would);
        # "threaded": Producer.send_async wrapped with asyncio.wrap_future (--opt api=threaded)
        self.api = str(opts.get("api", "aio"))
        if self.api not in ("aio", "threaded"):
            raise AdapterError(f"raftmq: --opt api must be aio or threaded, not {self.api!r}")
        self.aproducer: AsyncProducer | None = None
        self.queues: list[QueueRef] = []
        # --opt tls=1: TLS on every port (servers' --tls-*, the SDK's RAFTMQ_TLS_*), with a
        # development CA made in the run's directory; tls=mutual also asks clients for theirs.
        self.tls = str(opts.get("tls", "0"))
        if self.tls not in ("0", "1", "mutual"):
            raise AdapterError(f"raftmq: --opt tls must be 0, 1 or mutual, not {self.tls!r}")
        if self.tls != "0":
            self.variant += (
                f", TLS on every port ({'mutual' if self.tls == 'mutual' else 'server'})"
            )
        self.tls_flags: dict[str, list[str]] = {}

    def describe(self) -> dict[str, Any]:
        d: dict[str, Any] = super().describe()
        import raftmq

        d.update(
            {
                "server": f"raftmq {raftmq.__version__}",
                "client": (
                    "raftmq SDK (AsyncProducer.send_future, PullConsumer, idempotent)"
                    if self.api == "aio"
                    else "raftmq SDK (threaded Producer + wrap_future, PullConsumer, idempotent)"
                ),
                "commit": "Raft majority (2/3) commit; group fsync every 5 ms (ASYNC_FLUSH)",
            }
        )
        return d

    # ---- lifecycle ----------------------------------------------------------------------------

    def _make_certs(self, workdir: str) -> None:
        """The development CA and certificates (`raftmq cluster certs`'s code, run on the servers'
        Python: the harness venv may lack `cryptography`); the SDK reads RAFTMQ_TLS_*."""
        d = os.path.join(workdir, "certs")
        names = ["ns", "n0", "n1", "n2", "client"]
        code = (
            "import sys; from pathlib import Path; "
            "from raftmq.ops.certs import CertRequest, write_certs; "
            "write_certs(Path(sys.argv[1]), [CertRequest(n, ()) for n in sys.argv[2:]], days=2)"
        )
        import subprocess

        subprocess.run([SERVER_PYTHON, "-c", code, d, *names], check=True, env=_env(), timeout=60)
        for n in names[:-1]:
            self.tls_flags[n] = [
                "--tls-ca", f"{d}/ca.crt", "--tls-cert", f"{d}/{n}.crt",
                "--tls-key", f"{d}/{n}.key", "--tls-raft-key", f"{d}/raft.key",
            ]  # fmt: skip
            if self.tls == "mutual":
                self.tls_flags[n].append("--tls-require-client-cert")
        os.environ["RAFTMQ_TLS_CA"] = f"{d}/ca.crt"
        os.environ["RAFTMQ_TLS_CERT"] = f"{d}/client.crt"
        os.environ["RAFTMQ_TLS_KEY"] = f"{d}/client.key"

    async def start_cluster(self, workdir: str) -> None:
        ns_port = free_port()
        self.namesrv = f"{LOOPBACK}:{ns_port}"
        py = SERVER_PYTHON
        if self.tls != "0":
            self._make_certs(workdir)
        self.procs["ns"] = Proc(
            "raftmq-ns",
            [
                py,
                "-m",
                "raftmq.namesrv.server",
                "--listen",
                self.namesrv,
                *self.tls_flags.get("ns", []),
            ],
            os.path.join(workdir, "ns.log"),
            env=_env(),
        ).start()
        nodes = [f"n{i}" for i in range(3)]
        raft = {n: f"{LOOPBACK}:{free_port()}" for n in nodes}
        self.grpc = {n: f"{LOOPBACK}:{free_port()}" for n in nodes}
        members = ",".join(f"{n}={self.grpc[n]}/{raft[n]}" for n in nodes)
        for n in nodes:
            self.procs[n] = Proc(
                f"raftmq-{n}",
                [
                    py,
                    "-m",
                    "raftmq.broker.server",
                    "--broker-group",
                    GROUP,
                    "--node-id",
                    n,
                    "--members",
                    members,
                    "--data-dir",
                    os.path.join(workdir, n),
                    "--namesrv-addresses",
                    self.namesrv,
                    "--heartbeat-interval-ms",
                    "1000",
                    *self.tls_flags.get(n, []),
                ],
                os.path.join(workdir, f"{n}.log"),
                env=_env(),
            ).start()
        await asyncio.to_thread(wait_port, ns_port, START_TIMEOUT_S, self.procs["ns"])

        def topic_ready() -> bool:
            with Admin(self.namesrv) as admin:
                if not any(g.leader_node_id for g in admin.groups()):
                    return False
                try:
                    admin.create_topic(TOPIC, queues=self.partitions)
                except Exception as exc:  # created by an earlier try
                    if "already exists" not in str(exc):
                        raise
                return len(admin.route(TOPIC).write_queues()) == self.partitions

        await _until(topic_ready, START_TIMEOUT_S, "a leader and the topic's route")
        self.queues = [QueueRef(TOPIC, GROUP, q) for q in range(self.partitions)]
        if self.api == "aio":
            self.aproducer = AsyncProducer(self.namesrv)
            self.producer = self.aproducer.producer
        else:
            self.producer = Producer(self.namesrv)

    async def stop_cluster(self) -> None:
        self.aproducer = None
        if self.producer is not None:
            producer, self.producer = self.producer, None
            # never raises: the processes are killed below anyway
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.to_thread(producer.close), 10)
        for p in self.procs.values():
            p.kill()
        self.procs.clear()
        for k in ("RAFTMQ_TLS_CA", "RAFTMQ_TLS_CERT", "RAFTMQ_TLS_KEY"):
            if self.tls != "0":
                os.environ.pop(k, None)

    async def kill_leader(self) -> dict[str, Any]:
        def leader() -> str:
            with Admin(self.namesrv) as admin:
                for n, addr in self.grpc.items():
                    if not self.procs[n].alive():
                        continue
                    try:
                        if admin.broker_status(addr).role == common_pb2.LEADER:
                            return n
                    except Exception:
                        continue
            raise AdapterError("raftmq: no node reports itself leader")

        node = await asyncio.to_thread(leader)
        proc = self.procs[node]
        pid = proc.pid
        proc.kill()
        return {"node": node, "pid": pid}

    # ---- data path ----------------------------------------------------------------------------

    async def publish_async(self, seq: int, body: bytes) -> asyncio.Future[Any]:
        queue = self.queues[seq % self.partitions]
        if self.aproducer is not None:
            return self.aproducer.send_future(TOPIC, body, queue=queue)
        assert self.producer is not None
        fut = self.producer.send_async(TOPIC, body, queue=queue)
        return asyncio.wrap_future(fut)

    async def consume(  # type: ignore[override]  # an async generator, as the base documents
        self,
        group: str,
        batch: int = 512,
        idle_timeout: float = 2.0,
        max_msgs: int | None = None,
    ) -> AsyncIterator[list[bytes]]:
        consumer = PullConsumer(
            self.namesrv,
            group,
            start_from=StartFrom.EARLIEST,
            max_messages_per_pull=batch,
        )
        try:
            await asyncio.to_thread(consumer.subscribe, TOPIC)
            got = 0
            idle_since = time.monotonic()
            while max_msgs is None or got < max_msgs:
                msgs = await asyncio.to_thread(consumer.poll, 200, batch)
                if not msgs:
                    if time.monotonic() - idle_since > idle_timeout:
                        return
                    continue
                idle_since = time.monotonic()
                consumer.commit_async()
                got += len(msgs)
                yield [m.body for m in msgs]
        finally:
            await asyncio.to_thread(consumer.close)

    async def preload(
        self,
        n: int,
        make_body: Callable[[int], bytes],
        window: int = 256,
        deadline_s: float = 300.0,
    ) -> int:
        """W3's backlog through the batch API: batches of PRELOAD_BATCH, one queue each."""
        assert self.producer is not None
        producer = self.producer
        deadline = time.monotonic() + deadline_s

        def chunk(start: int) -> int:
            if time.monotonic() > deadline:
                return 0
            seqs = range(start, min(start + PRELOAD_BATCH, n))
            q = self.queues[(start // PRELOAD_BATCH) % self.partitions]
            producer.send_batch(TOPIC, [make_body(s) for s in seqs], queue=q)
            return len(seqs)

        with ThreadPoolExecutor(PRELOAD_THREADS) as pool:
            done = await asyncio.to_thread(lambda: sum(pool.map(chunk, range(0, n, PRELOAD_BATCH))))
        return done
