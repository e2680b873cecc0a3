"""The dashboard's HTTP shell: http.server with a bounded pool of worker threads (a page asks
the brokers over gRPC, so a slow one must not stall the others, and a flood must not start a
thread per connection). Requests beyond the pool and its short queue get 503."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from raftmq.ops.dashboard.app import Dashboard, Request, Response

log = logging.getLogger("raftmq.dashboard")

WORKERS = 8
MAX_PENDING = 32  # accepted connections waiting for a worker, beyond the busy ones
MAX_FORM_BYTES = 64 << 10
REQUEST_TIMEOUT_S = 30.0


class _Handler(BaseHTTPRequestHandler):
    server: DashboardServer
    protocol_version = "HTTP/1.0"  # one request per connection: no idle keep-alive holds a worker
    timeout = REQUEST_TIMEOUT_S

    def do_GET(self) -> None:
        self._serve("GET", b"")

    def do_POST(self) -> None:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_FORM_BYTES:
            self._send(Response(413, "form too large or without a length"))
            return
        self._serve("POST", self.rfile.read(length))

    def _serve(self, method: str, body: bytes) -> None:
        url = urlsplit(self.path)
        if url.path == "/healthz":
            self._send(Response(200, "ok\n", "text/plain; charset=utf-8"))
            return
        params = dict(parse_qsl(url.query, max_num_fields=64))
        if method == "POST":
            params.update(parse_qsl(body.decode("utf-8", "replace"), max_num_fields=64))
        self._send(self.server.dashboard.handle(Request(method, url.path, params)))

    def _send(self, resp: Response) -> None:
        data = resp.body.encode()
        self.send_response(resp.status)
        self.send_header("Content-Type", resp.content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        # The pages are ours alone: no framing by another site, no inline script ever needed.
        self.send_header("X-Frame-Options", "DENY")
        self.send_header("Content-Security-Policy", "default-src 'self'; style-src 'unsafe-inline'")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        log.info("dashboard.request %s", format % args)


class DashboardServer(HTTPServer):
    """Serves `dashboard` on (host, port); port 0 picks a free one (see `address`)."""

    daemon_threads = True

    def __init__(self, dashboard: Dashboard, host: str, port: int) -> None:
        self.dashboard = dashboard
        self._pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="dashboard")
        self._slots = threading.BoundedSemaphore(WORKERS + MAX_PENDING)
        super().__init__((host, port), _Handler)

    @property
    def address(self) -> str:
        host, port = self.server_address[:2]
        return f"{host!s}:{port}"

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            with contextlib.suppress(OSError):
                request.sendall(b"HTTP/1.0 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n")
            self.shutdown_request(request)
            return
        self._pool.submit(self._work, request, client_address)

    def _work(self, request: socket.socket, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self.shutdown_request(request)
            self._slots.release()

    def server_close(self) -> None:
        super().server_close()
        self._pool.shutdown(wait=False, cancel_futures=True)
