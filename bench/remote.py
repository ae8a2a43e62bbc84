#!/usr/bin/env python3
"""Remote reading: imgshards streaming shards vs ImageFolder-style per-file GETs (issue 6).

Run by hand (not in CI), under the shared benchmark lock:

    python ../shared/tools/make_imagefolder.py --out /tmp/rbench-tree --classes 20 --per-class 100
    flock /tmp/imgshards-bench.lock python bench/remote.py --tree /tmp/rbench-tree --packed /tmp/rbench-packed

The tree is packed first if ``--packed`` has no index. One HTTP server on 127.0.0.1 serves both
the tree and the shards, with ``Range`` support and a fixed delay before every response
(``--latency``, default 20 ms, like an object store's time to first byte). Every reader gets the
images' bytes and labels (no decoding: this measures getting the data to a worker):

- per-file GETs: what a naive remote ImageFolder does, one GET per image (``fs.cat_file`` through
  fsspec's HTTP file system), ``--threads`` of them at a time; "warm" reads the same files again
  through fsspec's ``simplecache`` (each file kept on local disk after its first GET);
- imgshards: one reader process as a DataLoader worker runs it: ``ShardSource`` + ``read_run`` for
  every shard, interleaved (up to 16 shards open at once); "cold" streams with no cache,
  "cold + cache" fills a cache directory while streaming, "warm" reads from that cache.

Each pipeline runs ``--rounds`` times and keeps its best round (the machine is shared). The
table gives images/s, GET requests per image, and each rate over the per-file cold rate.
"""

from __future__ import annotations

import argparse
import contextlib
import http.server
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import fsspec
import numpy as np

from imgshards.converter import PackConfig, pack, read_manifest, scan_tree
from imgshards.loader.epoch.order import interleave
from imgshards.loader.pipeline.tar import read_run
from imgshards.loader.remote.source import ShardSource

_RANGE = re.compile(r"bytes=(\d+)-(\d*)")


class _Handler(http.server.SimpleHTTPRequestHandler):
    """Static files with single byte ranges and a fixed delay before each response."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # else headers and body wait on a delayed ACK (+40 ms a response)
    latency = 0.0
    root = "."
    gets = 0
    lock = threading.Lock()

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, directory=self.root, **kwargs)

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        with self.lock:
            type(self).gets += 1
        time.sleep(self.latency)
        path = self.translate_path(self.path)
        if not os.path.isfile(path):
            return super().do_GET()
        size = os.path.getsize(path)
        match = _RANGE.fullmatch(self.headers.get("Range", ""))
        lo = int(match.group(1)) if match else 0
        hi = min(int(match.group(2)) + 1, size) if match and match.group(2) else size
        with open(path, "rb") as f:
            f.seek(lo)
            body = f.read(hi - lo)
        self.send_response(206 if match else 200)
        self.send_header("Content-Length", str(len(body)))
        if match:
            self.send_header("Content-Range", f"bytes {lo}-{hi - 1}/{size}")
        self.end_headers()
        self.wfile.write(body)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # the default backlog of 5 drops connections that many threads open at once

    def handle_error(self, request, client_address) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a client closing its pool is no error
            super().handle_error(request, client_address)


@contextlib.contextmanager
def serve(root: Path, latency: float) -> Iterator[tuple[str, type[_Handler]]]:
    handler = type("Handler", (_Handler,), {"latency": latency, "root": str(root), "gets": 0})
    server = _Server(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()


def per_file(base: str, files: list[str], threads: int, cache: Path | None) -> int:
    """GET every file, ``threads`` at a time; return the bytes read."""
    if cache is None:
        fs = fsspec.filesystem("http", skip_instance_cache=True)
        read: Callable[[str], bytes] = lambda url: fs.cat_file(url)  # noqa: E731
    else:
        fs = fsspec.filesystem("simplecache", target_protocol="http", cache_storage=str(cache))
        read = lambda url: fs.cat_file(url)  # noqa: E731
    with ThreadPoolExecutor(threads) as pool:
        return sum(len(b) for b in pool.map(lambda f: read(f"{base}/tree/{f}"), files))


def shards(base: str, packed: Path, cache: Path | None, limit: int) -> int:
    """Read every sample of every shard as a DataLoader worker does; return the bytes read."""
    split = read_manifest(packed).split("train")
    source = ShardSource(
        f"{base}/packed",
        cache_dir=cache,
        cache_limit=limit if cache is not None else None,
    )
    source.set_read_order(split.shards)
    runs = [
        read_run(source.url(s.name), 0, s.samples, opener=lambda s=s: source.open(s)) for s in split.shards
    ]
    rng = np.random.default_rng(0)
    return sum(len(sample.data) for sample in interleave(runs, [s.samples for s in split.shards], rng))


def best_of(rounds: int, run: Callable[[], int], before: Callable[[], None] | None = None) -> float:
    """Best seconds of ``rounds`` runs of ``run`` (``before`` runs untimed before each)."""
    best = float("inf")
    for _ in range(rounds):
        if before is not None:
            before()
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tree", type=Path, required=True, help="ImageFolder tree (make_imagefolder.py)")
    p.add_argument("--packed", type=Path, required=True, help="packed copy of the tree (made if absent)")
    p.add_argument("--latency", type=float, default=0.020, help="seconds before each response")
    p.add_argument("--threads", type=int, default=32, help="per-file GETs in flight")
    p.add_argument("--shard-size", type=int, default=32 * 10**6)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()

    if not (args.packed / "index.json").exists():
        pack(args.tree, args.packed, PackConfig(shard_size=args.shard_size, workers=2))
    split = read_manifest(args.packed).split("train")
    scan = scan_tree(args.tree)
    files = [scan.paths[i] for i in range(len(scan))]
    images, total = split.samples, split.bytes
    assert len(files) == images, (len(files), images)

    work = Path(tempfile.mkdtemp(prefix="imgshards-remote-bench-"))
    (work / "root").mkdir()
    (work / "root" / "tree").symlink_to(args.tree.resolve())
    (work / "root" / "packed").symlink_to(args.packed.resolve())
    rows: list[tuple[str, float, float]] = []
    try:
        with serve(work / "root", args.latency) as (base, handler):

            def measure(label: str, run: Callable[[], int], before: Callable[[], None] | None = None) -> None:
                gets = handler.gets
                seconds = best_of(args.rounds, run, before)
                rows.append((label, images / seconds, (handler.gets - gets) / args.rounds / images))
                print(f"  {label}: {images / seconds:,.0f} images/s", file=sys.stderr)

            def clear(path: Path) -> Callable[[], None]:
                return lambda: (shutil.rmtree(path, ignore_errors=True), path.mkdir())  # type: ignore[func-returns-value]

            files_cache, shard_cache = work / "files-cache", work / "shard-cache"
            limit = 2 * total
            measure(
                f"per-file GETs, {args.threads} threads, cold",
                lambda: per_file(base, files, args.threads, None),
            )
            clear(files_cache)()
            per_file(base, files, args.threads, files_cache)
            measure(
                f"per-file GETs, {args.threads} threads, warm (simplecache)",
                lambda: per_file(base, files, args.threads, files_cache),
            )
            measure("imgshards shards, cold (no cache)", lambda: shards(base, args.packed, None, limit))
            measure(
                "imgshards shards, cold, filling the cache",
                lambda: shards(base, args.packed, shard_cache, limit),
                before=clear(shard_cache),
            )
            shards(base, args.packed, shard_cache, limit)
            time.sleep(1.0)  # let the last downloads commit
            measure("imgshards shards, warm cache", lambda: shards(base, args.packed, shard_cache, limit))
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(
        f"{images:,} images ({total / images / 1000:.0f} kB each on average) in {len(split.shards)} shards "
        f"of ~{total / len(split.shards) / 1e6:.0f} MB; {args.latency * 1000:.0f} ms before every response; "
        f"best of {args.rounds}; {os.cpu_count()} CPUs (shared)"
    )
    width = max(len(label) for label, _, _ in rows)
    print(f"{'reader':<{width}}  {'images/s':>9}  {'GETs/image':>10}  {'vs per-file cold':>16}")
    baseline = rows[0][1]
    for label, rate, gets in rows:
        print(f"{label:<{width}}  {rate:>9,.0f}  {gets:>10.3f}  {rate / baseline:>15.1f}x")


if __name__ == "__main__":
    main()
