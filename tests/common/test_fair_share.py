"""common/fair_share.py as a state machine (Hypothesis): whatever the order of admits and
releases, no host and no user holds more than its cap, the total never passes the global cap,
refusals take nothing, and everything given back leaves the counts at zero."""

from __future__ import annotations

import collections

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from raftmq.common.errors import ThrottledError
from raftmq.common.fair_share import FairShare, ShareLimits, client_host

HOSTS = st.sampled_from(["127.0.0.1", "127.0.0.2", "10.0.0.9", "::1"])
USERS = st.sampled_from(["alice", "bob", "mallory"])


class Shares(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.shares = FairShare(ShareLimits(total=7, per_address=3, per_user=2))
        self.hosts: collections.Counter[str] = collections.Counter()
        self.users: collections.Counter[str] = collections.Counter()

    @rule(host=HOSTS)
    def admit(self, host: str) -> None:
        before = self.shares.total
        why = self.shares.admit(host)
        if why is None:
            self.hosts[host] += 1
        else:
            assert isinstance(why, ThrottledError)
            assert self.shares.total == before
            assert before == 7 or self.hosts[host] == 3  # refused only at a cap

    @precondition(lambda self: sum(self.hosts.values()) > 0)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        host = data.draw(st.sampled_from(sorted(h for h, n in self.hosts.items() if n)))
        self.shares.release(host)
        self.hosts[host] -= 1

    @rule(user=USERS)
    def admit_user(self, user: str) -> None:
        why = self.shares.admit_user(user)
        if why is None:
            self.users[user] += 1
        else:
            assert self.users[user] == 2 and user in why.message

    @precondition(lambda self: sum(self.users.values()) > 0)
    @rule(data=st.data())
    def release_user(self, data: st.DataObject) -> None:
        user = data.draw(st.sampled_from(sorted(u for u, n in self.users.items() if n)))
        self.shares.release_user(user)
        self.users[user] -= 1

    @invariant()
    def counts_match(self) -> None:
        assert self.shares.total == sum(self.hosts.values()) <= 7
        for host, n in self.hosts.items():
            assert self.shares.held_by(host) == n <= 3
        for user, n in self.users.items():
            assert self.shares.held_by_user(user) == n <= 2


TestShares = Shares.TestCase


def test_client_host_of_every_peer_form() -> None:
    assert client_host(("127.0.0.2", 5555)) == "127.0.0.2"
    assert client_host("127.0.0.2:5555") == "127.0.0.2"
    assert client_host("ipv4:10.1.2.3:40000") == "10.1.2.3"
    assert client_host("ipv6:[::1]:40000") == "::1"
    assert client_host("[fe80::1]:8080") == "fe80::1"
    assert client_host("unix:/tmp/s") == "unix"
