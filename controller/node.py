"""ControllerNode: the controller's state machine behind raftlog's ReplicatedLog (the same Raft
integration the brokers use), with an apply thread and the pushes to the NameServers.

Every controller applies every committed command; only the leader answers reports and pushes.
The log is small (one command per role change), so a restart replays it from the first entry.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

import grpc

from raftmq.common import tls
from raftmq.common.acl import Acl
from raftmq.common.acl_sync import admin_signer, auth_config_of
from raftmq.common.auth import Signer, call_metadata
from raftmq.common.errors import BrokerUnavailableError, NotLeaderError, OutcomeUnknownError
from raftmq.common.grpc_options import CHANNEL_LIVENESS
from raftmq.common.pb import broker_pb2, broker_pb2_grpc, common_pb2, namesrv_pb2, namesrv_pb2_grpc
from raftmq.controller.acl_state import AclCommand
from raftmq.controller.alarm_service import AlarmService
from raftmq.controller.balance import Transfer, parse_preferred, plan
from raftmq.controller.liveness import Liveness, Seen
from raftmq.controller.settings import ControllerSettings
from raftmq.controller.state import (
    AlarmChange,
    CommandError,
    ControllerState,
    GroupRecord,
    RoleReport,
    Verdict,
    decode,
)
from raftmq.raftlog import errors as rl_errors
from raftmq.raftlog.log import ReplicatedLog
from raftmq.raftlog.record import Role

log = logging.getLogger("controller")

MAX_VERDICTS = 10_000
REPORT_TIMEOUT_S = 5.0
BALANCE_EVERY_S = 1.0
TRANSFER_TIMEOUT_MS = 3_000


class Pusher:
    """Pushes a leader change to every NameServer at once; a dead one delays nobody."""

    def __init__(
        self, addresses: tuple[str, ...], timeout_ms: int, retries: int, signer: Signer | None
    ) -> None:
        self._signer = signer
        self._stubs = {
            a: namesrv_pb2_grpc.NameServerStub(tls.channel(a, CHANNEL_LIVENESS)) for a in addresses
        }
        self._timeout_s = timeout_ms / 1000
        self._retries = retries
        self._pool = ThreadPoolExecutor(max(2, 2 * len(addresses)), thread_name_prefix="push")

    def push(self, group: str, leader_node_id: str, term: int) -> None:
        req = namesrv_pb2.PushLeaderChangeRequest(
            broker_group=group, leader_node_id=leader_node_id, term=term
        )
        for address, stub in self._stubs.items():
            self._pool.submit(self._push_one, address, stub, req)

    def _push_one(
        self,
        address: str,
        stub: namesrv_pb2_grpc.NameServerStub,
        req: namesrv_pb2.PushLeaderChangeRequest,
    ) -> None:
        for attempt in range(self._retries):
            try:
                out = stub.PushLeaderChange(
                    req, timeout=self._timeout_s, metadata=call_metadata(self._signer)
                )
                log.info(
                    "controller.pushed namesrv=%s group=%s leader=%s term=%d result=%s",
                    address,
                    req.broker_group,
                    req.leader_node_id,
                    req.term,
                    namesrv_pb2.LeaderChangeResult.Name(out.result),
                )
                return
            except grpc.RpcError:
                time.sleep(min(0.2 * (attempt + 1), 1.0))
        log.warning("controller.push_failed namesrv=%s group=%s", address, req.broker_group)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class ControllerNode:
    def __init__(self, settings: ControllerSettings) -> None:
        self.settings = settings
        self.state = ControllerState()
        self._by_raft = {p.raft_address: p.address for p in settings.peer_list}
        self._by_raft[settings.raft_address] = settings.listen
        self._ids = {p.raft_address: p.node_id for p in settings.peer_list}
        self._ids[settings.raft_address] = settings.node_id
        self.rlog = ReplicatedLog(settings.raft_config())
        # signs this controller's calls to NameServers and brokers when auth is on (issue 19)
        self.signer = admin_signer(auth_config_of(settings))
        self.pusher = Pusher(
            settings.namesrv_list, settings.push_timeout_ms, settings.push_retries, self.signer
        )
        self._cond = threading.Condition()
        self.applied = 0
        self._verdicts: collections.OrderedDict[tuple[int, int], Verdict] = (
            collections.OrderedDict()
        )
        self._pushed_as_leader_term = -1
        self._preferred = parse_preferred(settings.preferred_leaders)
        self._last_attempt_ms: dict[str, int] = {}
        self._liveness = Liveness(settings.balance_alive_ms)
        self._liveness_lock = threading.Lock()
        self._next_balance = 0.0
        # One hand-off at a time: a transfer holds its group's leader for up to 3 s.
        self._balancer = ThreadPoolExecutor(1, thread_name_prefix="balance")
        self._balancing = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="controller-apply", daemon=True)
        # Alarms (issue 18): evaluated by the controller leader only, on a thread of their own.
        self.alarms = AlarmService(self)

    def start(self) -> None:
        self._thread.start()
        self.alarms.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():  # a start that failed to bind closes a node never started
            self._thread.join(timeout=5)
        self.alarms.close()
        self._balancer.shutdown(wait=False, cancel_futures=True)
        self.pusher.close()
        self.rlog.close(transfer_leadership=True)

    # ---- leadership ---------------------------------------------------------------------------

    def leader(self) -> tuple[str, str]:
        """(node id, gRPC address) of the controller leader, ("", "") if none is known."""
        st = self.rlog.status()
        raft = self.settings.raft_address if st.role is Role.LEADER else st.leader
        if not raft:
            return "", ""
        return self._ids.get(raft, ""), self._by_raft.get(raft, "")

    # ---- reports ------------------------------------------------------------------------------

    def report(self, r: RoleReport) -> Verdict:
        if not self.rlog.is_leader_ready():
            _, address = self.leader()
            hint = "" if address == self.settings.listen else address
            raise NotLeaderError.for_node(self.settings.node_id, "controllers", hint)
        with self._liveness_lock:
            self._liveness.observe(r.broker_group, r.node_id, r.now_ms)
        with self._cond:
            # Only with every committed entry applied: else the state may miss a newer term.
            same = (
                self.state.unchanged_verdict(r)
                if self.applied >= self.rlog.committed_index
                else None
            )
        if same is not None:
            return same
        return self._commit_and_wait(r.encode(), "the report")

    def commit_acl(self, command: AclCommand) -> Verdict:
        """Replicate an ACL change (issue 19) and return its verdict once applied here; the
        verdict's epoch is the ACL version after it. Leader only."""
        if not self.rlog.is_leader_ready():
            _, address = self.leader()
            hint = "" if address == self.settings.listen else address
            raise NotLeaderError.for_node(self.settings.node_id, "controllers", hint)
        return self._commit_and_wait(command.encode(), "the ACL change")

    def acl(self) -> Acl:
        """The users and policies as applied here (any controller; a follower may lag)."""
        with self._cond:
            return self.state.acl.snapshot()

    def _commit_and_wait(self, data: bytes, what: str) -> Verdict:
        try:
            fut = self.rlog.submit(data)
            committed = fut.result(timeout=REPORT_TIMEOUT_S)
        except FutureTimeout as exc:
            raise OutcomeUnknownError(f"{what} was not committed in time; check and retry") from exc
        except rl_errors.NotLeaderError as exc:
            raise NotLeaderError.for_node(self.settings.node_id, "controllers", "") from exc
        except rl_errors.RaftLogError as exc:
            raise BrokerUnavailableError(f"controller log: {exc}") from exc
        deadline = time.monotonic() + REPORT_TIMEOUT_S
        key = (committed.index, committed.slot)
        with self._cond:
            while key not in self._verdicts:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise OutcomeUnknownError(f"{what} was committed but not applied in time")
                self._cond.wait(left)
            return self._verdicts[key]

    def commit_alarm(self, change: AlarmChange) -> bool:
        """Replicate an alarm's firing or resolution and wait until it is applied here; False
        if it was not (not the leader any more, or no quorum in time)."""
        try:
            fut = self.rlog.submit(change.encode())
            committed = fut.result(timeout=REPORT_TIMEOUT_S)
        except (FutureTimeout, rl_errors.NotLeaderError, rl_errors.RaftLogError):
            return False
        deadline = time.monotonic() + REPORT_TIMEOUT_S
        with self._cond:
            while self.applied < committed.index:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def firing_alarms(self) -> list[AlarmChange]:
        """The firing alarms as replicated (every controller holds them)."""
        with self._cond:
            return list(self.state.firing.values())

    def caught_up(self) -> bool:
        return self.applied >= self.rlog.committed_index

    def liveness_view(self) -> Mapping[tuple[str, str], Seen]:
        with self._liveness_lock:
            return self._liveness.view()

    def records(self) -> list[GroupRecord]:
        with self._cond:
            return [
                GroupRecord(
                    g.broker_group, g.leader_node_id, g.term, g.epoch, g.changed_ms, dict(g.members)
                )
                for g in sorted(self.state.groups.values(), key=lambda g: g.broker_group)
            ]

    # ---- the apply loop -----------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            nxt = self.applied + 1
            if self.rlog.wait_committed(nxt, 0.1):
                for entry in self.rlog.read_from(nxt, max_bytes=1 << 20, max_entries=256):
                    self._apply(entry.index, entry.chunks)
            self._push_all_if_new_leader()
            self._balance()

    def _apply(self, index: int, chunks: tuple[bytes, ...]) -> None:
        changed: list[Verdict] = []
        with self._cond:
            for slot, chunk in enumerate(chunks):
                try:
                    verdict = self.state.apply(decode(chunk))
                except CommandError as exc:
                    log.warning(
                        "controller.bad_command index=%d slot=%d error=%s", index, slot, exc
                    )
                    verdict = Verdict(False, False, str(exc), "", "", 0, 0)
                self._verdicts[(index, slot)] = verdict
                if verdict.changed:
                    changed.append(verdict)
            while len(self._verdicts) > MAX_VERDICTS:
                self._verdicts.popitem(last=False)
            self.applied = index
            self._cond.notify_all()
        if changed and self.rlog.is_leader():
            for v in changed:
                log.info(
                    "controller.leader_change group=%s leader=%s term=%d epoch=%d",
                    v.group,
                    v.leader_node_id,
                    v.term,
                    v.epoch,
                )
                self.pusher.push(v.group, v.leader_node_id, v.term)

    def _push_all_if_new_leader(self) -> None:
        """A new controller leader pushes every record once: pushes of the old leader may have
        been lost with it (NameServers apply them idempotently by term)."""
        st = self.rlog.status()
        if st.role is not Role.LEADER or st.term == self._pushed_as_leader_term:
            return
        if not self.rlog.is_leader_ready() or self.applied < self.rlog.committed_index:
            return
        self._pushed_as_leader_term = st.term
        for g in self.records():
            if g.leader_node_id:
                self.pusher.push(g.broker_group, g.leader_node_id, g.term)

    # ---- leader balancing ---------------------------------------------------------------------

    def _balance(self) -> None:
        """The controller leader hands each group's leadership to its preferred node (see
        controller/balance.py for the rules), one hand-off at a time."""
        now = time.monotonic()
        if now < self._next_balance or self._balancing.is_set():
            return
        self._next_balance = now + BALANCE_EVERY_S
        if not self.rlog.is_leader_ready() or self.applied < self.rlog.committed_index:
            return
        now_ms = int(time.time() * 1000)  # records carry the brokers' wall-clock times
        with self._liveness_lock:
            seen = self._liveness.view()
        todo = plan(
            self.records(), self._preferred, self._last_attempt_ms, seen, now_ms,
            self.settings.balance_policy,
        )  # fmt: skip
        if not todo:
            return
        t = todo[0]
        self._last_attempt_ms[t.broker_group] = now_ms
        log.info(
            "controller.balance_attempt group=%s from=%s to=%s",
            t.broker_group,
            t.from_node,
            t.to_node,
        )
        self._balancing.set()
        try:
            self._balancer.submit(self._hand_off, t)
        except RuntimeError:  # shut down meanwhile
            self._balancing.clear()

    def _hand_off(self, t: Transfer) -> None:
        try:
            with tls.channel(t.to_address) as ch:  # one call, 1 s deadline
                st = broker_pb2_grpc.BrokerStub(ch).GetBrokerStatus(
                    broker_pb2.GetBrokerStatusRequest(),
                    timeout=1.0,
                    metadata=call_metadata(self.signer),
                )
            if st.role != common_pb2.FOLLOWER or st.leader_node_id != t.from_node:
                log.info(
                    "controller.balance_skipped group=%s to=%s reason=target_not_following",
                    t.broker_group,
                    t.to_node,
                )
                return
            if st.disk_full or st.storage_error or st.disk_pressure:
                # It would refuse to lead, and the attempt holds the leader's writes meanwhile.
                log.info(
                    "controller.balance_skipped group=%s to=%s reason=target_cannot_write error=%s",
                    t.broker_group,
                    t.to_node,
                    st.storage_error or st.disk_pressure or "disk full",
                )
                return
            with tls.channel(t.from_address) as ch:
                out = broker_pb2_grpc.BrokerStub(ch).LeadershipTransfer(
                    broker_pb2.LeadershipTransferRequest(
                        target_node_id=t.to_node, timeout_ms=TRANSFER_TIMEOUT_MS
                    ),
                    timeout=TRANSFER_TIMEOUT_MS / 1000 + 3,
                    metadata=call_metadata(self.signer),
                )
            log.info(
                "controller.balanced group=%s from=%s to=%s ok=%s leader=%s term=%d",
                t.broker_group,
                t.from_node,
                t.to_node,
                out.ok,
                out.leader_node_id,
                out.term,
            )
        except grpc.RpcError as exc:
            # The target is down or the leader moved meanwhile: try again after the interval.
            log.info(
                "controller.balance_failed group=%s to=%s code=%s",
                t.broker_group,
                t.to_node,
                exc.code().name if hasattr(exc, "code") else "?",
            )
        finally:
            self._balancing.clear()
