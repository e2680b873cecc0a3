"""The shared metrics pieces: the hot-path counters and histogram expose what was recorded
(parsed back with prometheus_client's parser), their label sets stay bounded, and the HTTP
endpoint answers /metrics, /healthz and /readyz (503 with the reason) on a real socket."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from raftmq.common.http_shell import HttpLimits
from raftmq.common.metrics_http import HotCounters, HotHistogram, MetricsServer, start_metrics
from raftmq.common.scrape_access import check_metrics_listen, metrics_bind


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def test_hot_counters_sum_and_overflow_past_the_bound() -> None:
    r = CollectorRegistry()
    c = HotCounters([("m_in", "messages"), ("b_in", "bytes")], ["topic"], max_series=2)
    r.register(c)
    c.add(("a",), 3, 300)
    c.add(("a",), 2, 200)
    c.add(("b",), 1, 10)
    c.add(("c",), 7, 70)  # a third topic: counted, under the overflow label
    c.add(("d",), 1, 1)
    s = samples(r)
    assert s[("m_in_total", (("topic", "a"),))] == 5
    assert s[("b_in_total", (("topic", "a"),))] == 500
    assert s[("m_in_total", (("topic", "b"),))] == 1
    assert s[("m_in_total", (("topic", "_other"),))] == 8
    assert ("m_in_total", (("topic", "c"),)) not in s


def test_hot_histogram_buckets_are_cumulative_with_le_bounds() -> None:
    r = CollectorRegistry()
    h = HotHistogram("lat_seconds", "latency", ["method"], [0.001, 0.01])
    r.register(h)
    for v in (0.001, 0.0005, 0.005, 3.0):  # 0.001 lies on a bound: it is in le=0.001
        h.observe(("send",), v)
    s = samples(r)
    key = (("method", "send"),)
    assert s[("lat_seconds_bucket", (("le", "0.001"), *key))] == 2
    assert s[("lat_seconds_bucket", (("le", "0.01"), *key))] == 3
    assert s[("lat_seconds_bucket", (("le", "+Inf"), *key))] == 4
    assert s[("lat_seconds_count", key)] == 4
    assert s[("lat_seconds_sum", key)] == pytest.approx(3.0065)


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_endpoint_serves_metrics_and_probes() -> None:
    r = CollectorRegistry()
    c = HotCounters([("x", "x")], ["k"])
    r.register(c)
    c.add(("v",), 1)
    state = {"ready": False}
    server = MetricsServer(r, lambda: (state["ready"], "the reason"), "test")
    address = server.start("127.0.0.1", 0)
    try:
        code, text = get(f"http://{address}/metrics")
        assert code == 200 and 'x_total{k="v"} 1.0' in text
        assert get(f"http://{address}/healthz") == (200, "ok\n")
        assert get(f"http://{address}/readyz") == (503, "not ready: the reason\n")
        state["ready"] = True
        assert get(f"http://{address}/readyz") == (200, "ready: the reason\n")
        assert get(f"http://{address}/nope")[0] == 404
    finally:
        server.stop()


def test_listen_values() -> None:
    for ok in ("", "off", "127.0.0.1:0", "0.0.0.0:9100"):
        check_metrics_listen(ok)
    for bad in ("9100", "host:", "host:99999", ":80"):
        with pytest.raises(ValueError, match="metrics_listen"):
            check_metrics_listen(bad)
    assert metrics_bind("off") is None and metrics_bind("") is None
    assert metrics_bind("[::1]:9100") == ("::1", 9100)
    assert start_metrics("off", CollectorRegistry(), lambda: (True, ""), "x") is None


def test_a_slow_or_greedy_client_keeps_no_more_than_its_share() -> None:
    """Issue 27, on the shell every HTTP port shares (common/http_shell.py): one host's 10 half
    request lines leave 4 held (its share) and 6 answered 503 at once; /healthz and /metrics
    answer another host meanwhile; the held ones are closed once quiet for the idle timeout;
    100 query parameters get a 400. Before: a thread per connection (ThreadingHTTPServer), none
    capped, none timed out."""
    import select
    import socket
    import time

    limits = HttpLimits(max_connections=64, max_connections_per_address=4, idle_timeout_s=0.5)
    server = MetricsServer(CollectorRegistry(), lambda: (True, "ok"), "test", limits)
    address = server.start("127.0.0.1", 0)
    port = int(address.rsplit(":", 1)[1])
    held = []
    try:
        for _ in range(10):
            s = socket.create_connection(("127.0.0.1", port), 5, source_address=("127.0.0.2", 0))
            s.sendall(b"GET /metrics HT")
            held.append(s)
        assert get(f"http://{address}/healthz") == (200, "ok\n")
        assert get(f"http://{address}/metrics")[0] == 200
        ready, _, _ = select.select(held, [], [], 0.3)
        answers = [s.recv(200) for s in ready]
        assert len(answers) == 6 and all(a.startswith(b"HTTP/1.1 503") for a in answers)
        assert b"127.0.0.2 already holds 4 connections" in answers[0]
        t0 = time.monotonic()
        rest = [s for s in held if s not in ready]
        for s in rest:
            s.settimeout(5)
            assert s.recv(200) == b""  # closed by the server, nothing answered
        assert time.monotonic() - t0 < 3
        code, text = get(f"http://{address}/metrics?" + "&".join(f"p{i}=1" for i in range(100)))
        assert code == 400 and "query parameters" in text
    finally:
        for s in held:
            s.close()
        server.stop()


def test_scrape_credentials_as_prometheus_sends_them() -> None:
    """Issue 27: basic auth or a bearer token per metrics port (Prometheus' basic_auth and
    authorization); /healthz stays open for liveness probes; a 401 says what to give."""
    import base64

    from raftmq.common.scrape_access import ScrapeSettings

    def opener(header: str | None) -> urllib.request.OpenerDirector:
        o = urllib.request.build_opener()
        o.addheaders = [("Authorization", header)] if header else []
        return o

    def fetch(address: str, path: str, header: str | None) -> int:
        try:
            with opener(header).open(f"http://{address}{path}", timeout=5) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as exc:
            assert exc.code != 401 or exc.headers["WWW-Authenticate"], exc.headers
            return exc.code

    basic = ScrapeSettings(metrics_basic_auth_user="prom", metrics_basic_auth_password="pw")
    bearer = ScrapeSettings(metrics_bearer_token="tok-123")
    good_basic = "Basic " + base64.b64encode(b"prom:pw").decode()
    cases = [
        (basic, good_basic, ["Basic " + base64.b64encode(b"prom:no").decode(), "Bearer pw"]),
        (bearer, "Bearer tok-123", ["Bearer tok-12", "Basic dG9rLTEyMw==", "tok-123", "Bearer é"]),
    ]
    for settings, good, bads in cases:
        server = start_metrics(
            "127.0.0.1:0", CollectorRegistry(), lambda: (True, ""), "t", settings
        )
        assert server is not None
        try:
            a = server.address
            assert fetch(a, "/metrics", good) == 200 and fetch(a, "/readyz", good) == 200
            assert fetch(a, "/healthz", None) == 200
            for bad in [None, *bads]:
                assert fetch(a, "/metrics", bad) == 401, bad
                assert fetch(a, "/readyz", bad) == 401, bad
        finally:
            server.stop()
    for wrong, what in (
        ({"metrics_basic_auth_user": "prom"}, "go together"),
        ({"metrics_tls": "tls"}, "metrics_tls"),
        ({"metrics_bearer_token": "t", "metrics_basic_auth_user": "u",
          "metrics_basic_auth_password": "p"}, "not both"),
    ):  # fmt: skip
        with pytest.raises(ValueError, match=what):
            ScrapeSettings(**wrong)  # type: ignore[arg-type]  # wrong on purpose


def test_metrics_tls_is_chosen_per_port(tmp_path: object) -> None:
    """Issue 27: the process has TLS (here: mutual); its metrics port may be server-only (a
    Prometheus without a client certificate scrapes it), mutual, or off."""
    import ssl
    from pathlib import Path

    from raftmq.common import tls
    from raftmq.common.scrape_access import ScrapeSettings
    from raftmq.common.settings import SettingsError
    from raftmq.ops.certs import CertRequest, write_certs

    d = Path(str(tmp_path)) / "certs"
    write_certs(d, [CertRequest("broker", ("127.0.0.1",)), CertRequest("client", ())])

    def scrape(address: str, ctx: ssl.SSLContext | None) -> int | str:
        scheme = "https" if ctx is not None else "http"
        try:
            with urllib.request.urlopen(
                f"{scheme}://{address}/metrics", timeout=5, context=ctx
            ) as r:
                return int(r.status)
        except (urllib.error.URLError, ConnectionError, ssl.SSLError) as exc:
            return type(exc).__name__

    ca_only = ssl.create_default_context(cafile=str(d / "ca.crt"))
    with_cert = ssl.create_default_context(cafile=str(d / "ca.crt"))
    with_cert.load_cert_chain(d / "client.crt", d / "client.key")
    tls.install(
        tls.load({"ca": str(d / "ca.crt"), "cert": str(d / "broker.crt"),
                  "key": str(d / "broker.key"), "require_client_cert": True}, environ={})
    )  # fmt: skip
    try:
        seen = {}
        for mode in ("", "server-only", "mutual", "off"):
            s = ScrapeSettings(metrics_tls=mode)
            server = start_metrics("127.0.0.1:0", CollectorRegistry(), lambda: (True, ""), "t", s)
            assert server is not None
            try:
                a = server.address
                plain = scrape(a, None)
                seen[mode] = (scrape(a, ca_only), scrape(a, with_cert), plain)
            finally:
                server.stop()
        assert seen["server-only"][:2] == (200, 200) and seen["server-only"][2] != 200
        assert seen["mutual"][0] != 200 and seen["mutual"][1] == 200
        assert seen[""] == seen["mutual"]  # as the process: mutual
        assert seen["off"][2] == 200 and seen["off"][0] != 200
    finally:
        tls.uninstall()
    with pytest.raises(SettingsError, match="needs the process's TLS"):
        start_metrics("127.0.0.1:0", CollectorRegistry(), lambda: (True, ""), "t",
                      ScrapeSettings(metrics_tls="mutual"))  # fmt: skip
