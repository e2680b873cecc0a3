"""The BrokerTransaction gRPC servicer: wire messages to TransactionShell calls and back; every
failure leaves through `rpc_errors` as a typed status, never as a traceback."""

from __future__ import annotations

import grpc

from raftmq.broker.service import _deadline, produce_hold, tell_throttle
from raftmq.broker.transactions_shell import TransactionShell
from raftmq.common.auth_guard import CALLER
from raftmq.common.errors import rpc_errors
from raftmq.common.pb import transaction_pb2, transaction_pb2_grpc
from raftmq.common.quota import Flow

TRANSACTION_SERVICE = transaction_pb2.DESCRIPTOR.services_by_name["BrokerTransaction"]


class TransactionService(transaction_pb2_grpc.BrokerTransactionServicer):
    def __init__(self, shell: TransactionShell) -> None:
        self.shell = shell

    @rpc_errors
    def SendHalfMessage(
        self, request: transaction_pb2.SendHalfMessageRequest, context: grpc.ServicerContext
    ) -> transaction_pb2.SendHalfMessageResponse:
        node, user = self.shell.node, CALLER.get()
        hold = produce_hold(node, user, context)  # a half send is a produce (issue 27)
        answer = self.shell.send_half(request)
        node.quota.charge(Flow.PRODUCE, user, request.ByteSize())
        answer.throttle_ms = hold.held_ms
        tell_throttle(context, hold.held_ms)
        return answer

    @rpc_errors
    def EndTransaction(
        self, request: transaction_pb2.EndTransactionRequest, context: grpc.ServicerContext
    ) -> transaction_pb2.EndTransactionResponse:
        return self.shell.end(request)

    @rpc_errors
    def PollTransactionChecks(
        self, request: transaction_pb2.PollTransactionChecksRequest, context: grpc.ServicerContext
    ) -> transaction_pb2.PollTransactionChecksResponse:
        return self.shell.poll(request, _deadline(context))
