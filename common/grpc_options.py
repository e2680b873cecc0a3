"""gRPC options every process uses for its channels and servers: how soon a connection that went
silent is noticed and replaced.

A dropped packet does not close a TCP connection. Both ends stay ESTABLISHED and the sender
retransmits with an exponential back-off (the RTO doubles from 200 ms), so after a 15-20 s
partition heals the next retransmission can be many seconds away; gRPC's default reconnect
back-off (1 s, growing 1.6x up to 120 s, each connect attempt allowed 20 s) adds to that. The
chaos suite's client-cut saw no acknowledgement for 10 s after the heal with the defaults.
Keepalive pings close a transport that stops answering within KEEPALIVE_TIME_MS +
KEEPALIVE_TIMEOUT_MS, and a short reconnect back-off reconnects about a second after the heal.
"""

from __future__ import annotations

KEEPALIVE_TIME_MS = 2_000  # ping a transport with calls in flight this often...
KEEPALIVE_TIMEOUT_MS = 2_000  # ...and drop it when a ping goes unanswered this long
RECONNECT_BACKOFF_MS = 1_000  # longest wait between connect attempts, and each one's timeout

Options = list[tuple[str, int]]

CHANNEL_LIVENESS: Options = [
    ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ("grpc.keepalive_permit_without_calls", 0),  # an idle channel is checked by its next call
    ("grpc.http2.max_pings_without_data", 0),  # a long poll sends nothing for seconds: keep pinging
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", RECONNECT_BACKOFF_MS),  # gRPC core: connect attempt timeout
    ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MS),
]

SERVER_LIVENESS: Options = [
    # Accept the channels' pings: by default a server counts pings closer than 5 min apart on a
    # stream without data (a long poll) as abuse and closes the connection after two.
    ("grpc.http2.min_ping_interval_without_data_ms", KEEPALIVE_TIME_MS // 2),
    ("grpc.http2.max_ping_strikes", 0),
    ("grpc.keepalive_permit_without_calls", 1),
    # Issue 27: gRPC has no count of connections per client to cap, so a connection that holds
    # nothing is bounded instead: a TLS or HTTP/2 handshake that does not finish (half-open or
    # hostile; grpc's default waits 120 s), and one without a call for 5 min (the client
    # reconnects at its next call).
    ("grpc.server_handshake_timeout_ms", 10_000),
    ("grpc.max_connection_idle_ms", 5 * 60_000),
]
