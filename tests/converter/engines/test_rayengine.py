"""``pack --engine ray`` on a real local Ray cluster: the pool's bytes, through lost nodes and drivers.

The engine is picked by converter/engines/engine.py; each attempt at a shard writes a temporary file
of its own (converter/write/attempts.py).

One cluster for the module (``ray.cluster_utils.Cluster``): a head with no CPU, so every task runs on
one of two 1-CPU nodes, and health checks fast enough that a killed node is declared dead in about
two seconds. The test that kills a node runs last: the others need both nodes.
"""

from __future__ import annotations

import io
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from PIL import Image

from imgshards.converter import (
    DestinationError,
    EngineError,
    PackConfig,
    pack,
    pack_to_url,
    scan_tree,
    verify,
)
from imgshards.converter.plan.tasks import plan_part, shard_task, split_parts
from imgshards.converter.write.shard import write_shard

ray = pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")
from ray.cluster_utils import Cluster  # noqa: E402
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: E402

from imgshards.converter.engines import rayengine  # noqa: E402

IMGSHARDS = Path(sys.executable).with_name("imgshards")
RESIZED = {"resize": 32, "shard_size": 12_000}  # re-encoded: bytes that depend on Pillow and libjpeg
CONVERTED = {"shard_size": 24_000}  # the tree's PNGs converted to the split's format, JPEG
LOCKS = {"lock", "index.lock"}


def _start_cluster() -> Cluster:
    """Head (no CPU) and two 1-CPU nodes; tried again if a raylet misses Ray's fixed 30 s to register.

    On a loaded machine that can happen; the processes of a failed try (all started by this process,
    as children) are killed before the next.
    """
    # Under load a raylet's Python agents can take longer to start than the raylet waits for them
    # (it then aborts); the nodes inherit this from the environment.
    os.environ.setdefault("RAY_agent_register_timeout_ms", "120000")
    health = {
        "health_check_period_ms": 500,
        "health_check_failure_threshold": 3,
        "health_check_timeout_ms": 500,
    }
    for attempt in range(3):
        before = {p.pid for p in psutil.Process().children(recursive=True)}
        c = None
        try:
            c = Cluster(
                initialize_head=True,
                head_node_args={"num_cpus": 0, "include_dashboard": False, "_system_config": health},
            )
            for _ in range(2):
                c.add_node(num_cpus=1)
            c.wait_for_nodes()
            return c
        except Exception:
            if c is not None:
                c.shutdown()
            for p in psutil.Process().children(recursive=True):
                if p.pid not in before:
                    p.kill()
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


@pytest.fixture(scope="module")
def cluster():
    c = _start_cluster()
    try:
        ray.init(address=c.address, logging_level=logging.WARNING, log_to_driver=False)
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


@pytest.fixture(scope="module")
def mixed_tree(tree_factory, tmp_path_factory) -> Path:
    """JPEGs, PNGs (every third image), a grey JPEG and an undecodable file: something of everything."""
    src = tmp_path_factory.mktemp("mixed") / "src"
    shutil.copytree(tree_factory(classes=3, per_class=24), src)
    for i, path in enumerate(sorted(src.rglob("*.JPEG"))):
        if i % 3 == 0:
            with Image.open(path) as im:
                im.save(path.with_suffix(".png"))
            path.unlink()
        elif i % 7 == 0:
            with Image.open(path) as im:
                buf = io.BytesIO()
                im.convert("L").save(buf, format="JPEG", quality=80)
            path.write_bytes(buf.getvalue())
    (next(src.iterdir()) / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    return src


@pytest.fixture(scope="module")
def baselines(mixed_tree, tmp_path_factory) -> dict[str, Path]:
    """The local pool's output for each configuration, the reference every Ray run must match."""
    out = {}
    for name, options in (("resized", RESIZED), ("converted", CONVERTED)):
        out[name] = tmp_path_factory.mktemp("pool") / name
        pack(mixed_tree, out[name], PackConfig(workers=2, **options))
    return out


def files(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` but lock files, by relative path."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name not in LOCKS
    }


def assert_identical(out: Path, baseline: Path) -> None:
    got, want = files(out), files(baseline)
    assert sorted(got) == sorted(want)
    assert [name for name in want if got[name] != want[name]] == []


def test_ray_output_is_the_pools_byte_for_byte(cluster, mixed_tree, baselines, tmp_path):
    # Through the CLI, a driver process of its own joining the cluster by address.
    out = tmp_path / "resized"
    cmd = [str(IMGSHARDS), "pack", str(mixed_tree), str(out), "--engine", "ray", "--ray-address"]
    cmd += [cluster.address, "--resize", "32", "--shard-size", "12000B", "--json"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout)
    assert summary["engine"] == "ray"
    assert sum(summary["nodes"].values()) == summary["shards_written"] > 2
    assert len(summary["nodes"]) == 2  # both 1-CPU nodes wrote shards; the head has no CPU
    assert summary["splits"]["train"]["rejects"]["total"] == 1
    assert_identical(out, baselines["resized"])
    assert verify(out).ok

    # From Python, in this process, a format conversion (PNG -> JPEG) instead of a resize.
    out = tmp_path / "converted"
    result = pack(mixed_tree, out, PackConfig(engine="ray", **CONVERTED))
    assert result.info.converted and result.engine == "ray"
    assert_identical(out, baselines["converted"])


def test_a_node_with_other_codecs_is_named(cluster, mixed_tree, tmp_path, monkeypatch):
    # One machine has one Pillow: the driver's side of the comparison stands in for another's.
    monkeypatch.setattr(rayengine, "codecs", lambda: {"pillow": "0.0", "libjpeg": "6b"})
    with pytest.raises(EngineError, match=r"node \S+:[0-9a-f]{8} re-encodes images .*pillow") as e:
        pack(mixed_tree, tmp_path / "out", PackConfig(engine="ray", **RESIZED))
    assert "\n" not in str(e.value)


def test_a_url_destination_on_ray_needs_a_shared_staging_directory(mixed_tree):
    with pytest.raises(DestinationError, match=r"with a URL \(s3://bucket/prefix\) needs --staging DIR"):
        pack_to_url(mixed_tree, "s3://bucket/prefix", PackConfig(engine="ray"))


def test_a_url_destination_on_ray_is_the_pools_too(cluster, mixed_tree, baselines, tmp_path, monkeypatch):
    # The nodes write into a staging directory they share (here, one machine's), the driver uploads.
    fsspec = pytest.importorskip("fsspec")
    moto_server = pytest.importorskip("moto.server")
    for name in [n for n in os.environ if n.startswith("AWS_")]:
        monkeypatch.delenv(name)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        options = {"key": "testing", "secret": "testing", "endpoint_url": f"http://{host}:{port}"}
        fs = fsspec.filesystem("s3", **options)
        fs.mkdir("packed")
        config = PackConfig(engine="ray", **RESIZED)
        pack_to_url(mixed_tree, "s3://packed/ds", config, storage_options=options, staging=tmp_path / "stage")
        uploaded = {p.split("packed/ds/", 1)[1]: fs.cat_file(p) for p in fs.find("packed/ds")}
    finally:
        server.stop()
    assert uploaded == files(baselines["resized"])


def test_two_attempts_at_one_shard_at_once_write_it_whole(cluster, mixed_tree, tmp_path):
    # One shard of the whole tree, written first here (the reference), then by two Ray attempts that
    # overlap for sure: the first is frozen mid-shard while the second writes the shard whole, then
    # thawed to finish and rename its copy over the second's (a straggler from a node thought dead).
    config = PackConfig(resize=32, shard_size=10**9)
    scan = scan_tree(mixed_tree)
    (part,) = split_parts(scan, config, None)
    plan = plan_part(part, len(scan), config)
    (tmp_path / "ref").mkdir()
    write_shard(shard_task(part, plan, 0, tmp_path / "ref", config, None))
    reference = (tmp_path / "ref" / "train-000000.tar").read_bytes()
    out = tmp_path / "out"
    out.mkdir()
    task = shard_task(part, plan, 0, out, config, None)

    def on(node):
        strategy = NodeAffinitySchedulingStrategy(node.node_id, soft=False)
        return rayengine._run_remote.options(scheduling_strategy=strategy).remote(write_shard, task, None)

    first_node, second_node = cluster.worker_nodes
    first = on(first_node)
    _, frozen, shards = _freeze_mid_shard([first_node], out)
    try:
        assert shards == ["train-000000.tar"]
        second, _ = ray.get(on(second_node), timeout=120)
        assert (out / "train-000000.tar").read_bytes() == reference
        assert len(list(out.glob(".*.partial"))) == 1  # the frozen attempt's, still open
    finally:
        for p in frozen:
            p.resume()
    first, _ = ray.get(first, timeout=120)
    assert first == second
    assert (out / "train-000000.tar").read_bytes() == reference
    assert [p.name for p in out.iterdir()] == ["train-000000.tar"]  # no attempt's file left


def _state(out: Path) -> Path:
    return out / ".imgshards" / "train"


def test_a_killed_driver_is_resumed_by_either_engine(cluster, mixed_tree, baselines, tmp_path):
    out = tmp_path / "ray"
    cmd = [str(IMGSHARDS), "pack", str(mixed_tree), str(out), "--engine", "ray", "--ray-address"]
    driver = subprocess.Popen([*cmd, cluster.address, "--resize", "32", "--shard-size", "12000B", "-q"])
    try:
        deadline = time.monotonic() + 240
        while not list(_state(out).glob("*.tar.json")):
            assert driver.poll() is None, "the driver ended before it was killed"
            assert time.monotonic() < deadline, "no shard recorded in time"
            time.sleep(0.005)
        driver.send_signal(signal.SIGSTOP)  # stop it writing records, then kill it
        driver.kill()
    finally:
        driver.kill()
        driver.wait(30)
    planned = json.loads((_state(out) / "plan.json").read_text())["shards"]
    recorded = len(list(_state(out).glob("*.tar.json")))
    assert 0 < recorded < planned
    shutil.copytree(out, tmp_path / "pool")

    by_ray = pack(mixed_tree, out, PackConfig(engine="ray", **RESIZED))
    by_pool = pack(mixed_tree, tmp_path / "pool", PackConfig(workers=2, **RESIZED))
    for result in (by_ray, by_pool):
        assert result.shards_reused >= recorded
        assert result.shards_written + result.shards_reused == planned
        assert_identical(result.dst, baselines["resized"])


def _processes(node) -> list:
    """A node's raylet and every process under it (its workers)."""
    raylet = node.all_processes[ray._private.ray_constants.PROCESS_TYPE_RAYLET][0].process.pid
    return [psutil.Process(raylet), *psutil.Process(raylet).children(recursive=True)]


def _attempts(pids: set[int], out: Path) -> list[str]:
    """The shards processes ``pids`` are writing into ``out`` now, from their attempts' files.

    An attempt's temporary file is ``.{shard}.{host}.{pid}.{random}.partial``.
    """
    return sorted(
        p.name[1:].split(".tar.")[0] + ".tar"
        for p in out.glob(".*.partial")
        if int(p.name.split(".")[-3]) in pids
    )


def _freeze_mid_shard(nodes, out: Path, stop: threading.Event | None = None):
    """SIGSTOP the first of ``nodes`` seen writing a shard into ``out``, while it is.

    Returns the node, its processes (stopped) and the shards it was writing; ``None`` if ``stop`` is
    set first. The directory is watched; a node is frozen only when one of its attempts shows, and
    let go again if that attempt finished before it froze.
    """
    deadline = time.monotonic() + 120
    while not (stop is not None and stop.is_set()):
        assert time.monotonic() < deadline, "no node held a shard to freeze"
        if any(out.glob(".*.partial")):
            for node in nodes:
                procs = _processes(node)
                pids = {p.pid for p in procs}
                if not _attempts(pids, out):
                    continue
                for p in procs:
                    p.suspend()
                if shards := _attempts(pids, out):
                    return node, procs, shards
                for p in procs:
                    p.resume()
        time.sleep(0.001)
    return None


def test_a_node_killed_mid_run_changes_nothing(cluster, mixed_tree, tmp_path):
    # Shards of a dozen images, so that each is being written for a while.
    options = {"resize": 32, "shard_size": 40_000}
    baseline = tmp_path / "pool"
    pack(mixed_tree, baseline, PackConfig(workers=2, **options))
    out = tmp_path / "out"
    out.mkdir()
    done = threading.Event()
    killed = []

    def kill_a_node_mid_shard() -> None:
        if (frozen := _freeze_mid_shard(list(cluster.worker_nodes), out, done)) is None:
            return
        node, procs, shards = frozen
        for p in procs:
            p.kill()  # SIGKILL: the raylet and its workers, mid-shard
        cluster.remove_node(node, allow_graceful=False)
        killed.append((node.node_id[:8], shards))

    killer = threading.Thread(target=kill_a_node_mid_shard)
    killer.start()
    try:
        result = pack(mixed_tree, out, PackConfig(engine="ray", **options))
    finally:
        done.set()
        killer.join()
    assert killed, "the run ended before a node could be killed mid-shard"
    ((victim, cut),) = killed
    assert result.retried == tuple(cut)  # the shard cut off was written again, and is shown
    assert [node for node in result.nodes if not node.endswith(victim)]  # by the other node
    assert_identical(out, baseline)
    assert verify(out).ok


def test_ray_address_without_the_ray_engine_is_a_usage_error(mixed_tree, tmp_path):
    cmd = [str(IMGSHARDS), "pack", str(mixed_tree), str(tmp_path / "out"), "--ray-address", "auto"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert "ray_address applies to engine 'ray' only" in run.stderr
    assert not (tmp_path / "out").exists()


def test_an_address_nothing_answers_at_fails_at_once(mixed_tree, tmp_path):
    cmd = [str(IMGSHARDS), "pack", str(mixed_tree), str(tmp_path / "out"), "--engine", "ray"]
    run = subprocess.run([*cmd, "--ray-address", "127.0.0.1:1"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        "Error: no Ray cluster answers at 127.0.0.1:1 (Connection refused); start one with "
        "`ray start --head` there, or pass the address `ray start` printed"
    ]
