"""HTTP servers that answer badly on purpose, for the deadline and stall tests (issue 37).

Each serves a directory with byte ranges and an ETag, and misbehaves on the files whose names end
with one of ``bad`` (the index and the other shards are served as a good server would):

- ``stall``: the headers and the first ``head`` bytes of the body, then silence with the socket
  open (until the test ends);
- ``trickle``: one byte every ``pause`` seconds, for as long as the client listens;
- ``redirect``: ``302`` to ``location`` (a ``file://`` URL, say), counted in ``hits``.
"""

from __future__ import annotations

import contextlib
import http.server
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from ...remote_servers import serving

_RANGE = re.compile(r"bytes=(\d+)-(\d*)")


class HostileHandler(http.server.SimpleHTTPRequestHandler):
    """Serves ``root``; a GET of a file named in ``bad`` answers as ``kind`` says (module docstring)."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    root: Path
    bad: tuple[str, ...]
    kind: str
    head: int = 1000
    pause: float = 0.5
    location: str = "file:///etc/passwd"
    hits: list[str]
    release: threading.Event

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, directory=str(self.root), **kwargs)

    def log_message(self, format: str, *args) -> None:
        pass

    def do_GET(self) -> None:
        path = Path(self.translate_path(self.path))
        if not path.is_file():
            return super().do_GET()  # the directory listing
        bad = path.name.endswith(self.bad)
        if bad:
            self.hits.append(path.name)
        if bad and self.kind == "redirect":
            self.send_response(302)
            self.send_header("Location", self.location)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        data = path.read_bytes()
        match = _RANGE.fullmatch(self.headers.get("Range", ""))
        lo, hi = 0, len(data)
        if match:
            lo, hi = int(match.group(1)), min(int(match.group(2) or len(data) - 1) + 1, len(data))
        self.send_response(206 if match else 200)
        self.send_header("Content-Length", str(hi - lo))
        self.send_header("ETag", f'"{len(data):x}"')
        if match:
            self.send_header("Content-Range", f"bytes {lo}-{hi - 1}/{len(data)}")
        self.end_headers()
        if not bad:
            self.wfile.write(data[lo:hi])
            return
        if self.kind == "stall":
            self.wfile.write(data[lo : min(hi, lo + self.head)])
            self.wfile.flush()
            self.release.wait(120)
        else:  # trickle
            for i in range(lo, hi):
                if self.release.is_set():
                    break
                self.wfile.write(data[i : i + 1])
                self.wfile.flush()
                time.sleep(self.pause)
        self.close_connection = True


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64

    def handle_error(self, request, client_address) -> None:
        pass  # a client that gave up on a bad answer


@contextlib.contextmanager
def hostile_server(root: Path, kind: str, bad: tuple[str, ...], **attrs) -> Iterator[tuple[str, list[str]]]:
    """Serve ``root`` on 127.0.0.1, misbehaving (``kind``) on ``bad``; yield the base URL and the hits."""
    release = threading.Event()
    hits: list[str] = []
    fields = {"root": root, "kind": kind, "bad": bad, "hits": hits, "release": release, **attrs}
    handler = type("Handler", (HostileHandler,), fields)
    with serving(_Server(("127.0.0.1", 0), handler)) as base:
        try:
            yield base, hits
        finally:
            release.set()  # before the shutdown: the stalled answers end
