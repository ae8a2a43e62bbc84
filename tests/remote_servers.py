"""Real servers on 127.0.0.1 for the remote tests: moto's S3 server (through s3fs) and an HTTP server.

The HTTP server serves a directory with ``Range`` support and an ETag (as nginx: mtime and size),
logs every request, adds a fixed latency, and can be told to misbehave once for a given file: cut
the connection halfway through a response, answer 503, 403 or 404, stall past the client's timeout,
or replace the file with other bytes once a response is sent.

Both sides use them: the loader's remote tests (tests/loader/remote/), the converter's
(tests/converter/remote/) and tests/test_remote_secrets.py. This is a module, not a conftest, so
that each side can reach it: tests/conftest.py takes its fixtures (one moto server and one
``remote_packed`` a session), and the remote tests' conftests take ``_no_aws_env``, autouse there.
"""

from __future__ import annotations

import contextlib
import http.server
import logging
import os
import re
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

_RANGE = re.compile(r"bytes=(\d+)-(\d*)")


@dataclass
class Fault:
    """Misbehave on ``times`` GETs, from the ``nth`` (1-based), of the file whose name ends with ``name``."""

    name: str
    kind: str  # "cut", "503", "403", "404", "stall", or "swap" (after the answer, the file holds `data`)
    nth: int = 1
    times: int = 1
    stall: float = 3.0
    data: bytes = b""
    seen: int = 0


@dataclass
class Request:
    method: str
    path: str
    start: int | None
    end: int | None


@dataclass
class ServerState:
    root: Path
    latency: float = 0.0
    listing: bool = True
    no_listing: int = 404  # the status of a directory when listing is False (nginx without autoindex: 403)
    faults: list[Fault] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add_fault(self, name: str, kind: str, **kwargs) -> Fault:
        fault = Fault(name, kind, **kwargs)
        with self.lock:
            self.faults.append(fault)
        return fault

    def gets(self, suffix: str = "") -> list[Request]:
        with self.lock:
            return [r for r in self.requests if r.method == "GET" and r.path.endswith(suffix)]

    def fault_for(self, path: str) -> Fault | None:
        with self.lock:
            for fault in self.faults:
                if path.endswith(fault.name):
                    fault.seen += 1
                    if fault.nth <= fault.seen < fault.nth + fault.times:
                        return fault
        return None


class RangeHandler(http.server.SimpleHTTPRequestHandler):
    """``SimpleHTTPRequestHandler`` plus single byte ranges, latency, a request log and faults."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # else headers and body wait on a delayed ACK (+40 ms a response)
    state: ServerState  # set on the subclass made per server

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, directory=str(self.state.root), **kwargs)

    def log_message(self, format: str, *args) -> None:
        pass

    def list_directory(self, path):
        if self.state.listing:
            return super().list_directory(path)
        self.send_error(
            self.state.no_listing, "No listing"
        )  # as most servers and CDNs: no page for a directory
        return None

    def do_GET(self) -> None:
        match = _RANGE.fullmatch(self.headers.get("Range", ""))
        start = int(match.group(1)) if match else None
        end = int(match.group(2)) + 1 if match and match.group(2) else None
        with self.state.lock:
            self.state.requests.append(Request("GET", self.path, start, end))
        time.sleep(self.state.latency)
        path = Path(self.translate_path(self.path))
        if not path.is_file():
            return super().do_GET()  # directory listings and 404s
        fault = self.state.fault_for(self.path)
        if fault is not None and fault.kind in ("503", "403", "404"):
            self.send_error(int(fault.kind))
            return
        if fault is not None and fault.kind == "stall":
            time.sleep(fault.stall)
        size = path.stat().st_size
        lo, hi = (start, min(end or size, size)) if start is not None else (0, size)
        if lo >= size and size:
            self.send_error(416, "Range Not Satisfiable")
            return
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            size = st.st_size
            lo, hi = (start, min(end or size, size)) if start is not None else (0, size)
            f.seek(lo)
            body = f.read(hi - lo)
        self.send_response(206 if start is not None else 200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("ETag", f'"{st.st_mtime_ns:x}-{size:x}"')
        self.send_header("Last-Modified", self.date_time_string(int(st.st_mtime)))
        if start is not None:
            self.send_header("Content-Range", f"bytes {lo}-{hi - 1}/{size}")
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        if fault is not None and fault.kind == "cut":
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            # Reset the connection (RST, not a clean close) halfway through the body.
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
            self.close_connection = True
            return
        self.wfile.write(body)
        if fault is not None and fault.kind == "swap":  # atomically, as an upload would
            (path.parent / f".{path.name}.swap").write_bytes(fault.data)
            os.replace(path.parent / f".{path.name}.swap", path)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # the default backlog of 5 drops connections opened at once

    def handle_error(self, request, client_address) -> None:
        # A client that gave up on a response (a timeout being tested) is not a server bug.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


@contextlib.contextmanager
def http_server(root: Path, latency: float = 0.0, listing: bool = True) -> Iterator[tuple[str, ServerState]]:
    """Serve ``root`` on 127.0.0.1 (a free port) in a thread; yield its base URL and state."""
    state = ServerState(root=root, latency=latency, listing=listing)
    handler = type("Handler", (RangeHandler,), {"state": state})
    with serving(_Server(("127.0.0.1", 0), handler)) as base:
        yield base, state


@contextlib.contextmanager
def serving(server: http.server.HTTPServer) -> Iterator[str]:
    """Run ``server`` (bound to 127.0.0.1) in a thread; yield its base URL; shut it down after."""
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture
def http_serve():
    """``http_serve(root, latency=0.0, listing=True)``: serve a directory; returns (base URL, state)."""
    with contextlib.ExitStack() as stack:
        yield lambda root, latency=0.0, listing=True: stack.enter_context(
            http_server(Path(root), latency, listing)
        )


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """A moto S3 server on 127.0.0.1 for the whole session."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3(s3_endpoint) -> tuple[str, dict]:
    """A fresh bucket: ``(s3://bucket, storage_options)``."""
    import fsspec

    bucket = f"test-{uuid.uuid4().hex[:12]}"
    options = {"key": "testing", "secret": "testing", "endpoint_url": s3_endpoint}
    fsspec.filesystem("s3", **options).mkdir(bucket)  # s3fs: a top-level mkdir creates a bucket
    return f"s3://{bucket}", options


@pytest.fixture(autouse=True)
def _no_aws_env(monkeypatch):
    # Only storage_options reach the server; a developer's own AWS settings must not leak in.
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)


REMOTE_SHARD_SIZE = 30_000


@pytest.fixture(scope="session")
def remote_tree(tree_factory) -> Path:
    """6 classes x 20 tiny real JPEGs (do not modify it)."""
    return tree_factory(classes=6, per_class=20, seed=3)


@pytest.fixture(scope="session")
def remote_packed(remote_tree, packed_factory) -> Path:
    """``remote_tree`` packed locally into shards of ~30 kB (do not modify it)."""
    return packed_factory(remote_tree, shard_size=REMOTE_SHARD_SIZE)
