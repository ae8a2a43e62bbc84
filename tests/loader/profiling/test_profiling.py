"""The bench's library side: stage clocks in the workers, the verdict, page-cache eviction, a real bench."""

import dataclasses
import os
import shutil
import subprocess
import time

import pytest
import torch

from imgshards.converter import PackConfig, pack
from imgshards.loader import ConfigError, ShardDataset, make_loader
from imgshards.loader.pipeline.steps import DECODE, NO_CLOCK, READ, STEPS, StepTimes
from imgshards.loader.profiling import BenchConfig, bench, procstats, steps
from imgshards.loader.profiling.report import LOADER_BOUND_WAIT, BenchPoint, RunResult, Verdict


def test_clock_adds_up_stage_seconds_and_publishes_per_batch():
    times = StepTimes(1)
    clock = times.clock()
    slow = clock.timed(DECODE, lambda x: time.sleep(0.05) or x)
    items = list(clock.timed_iter(READ, iter(range(3))))
    assert items == [0, 1, 2] and slow(5) == 5
    assert times.batches() == 0  # nothing published before the batch is done
    clock.batch_done(images=2)
    snap = times.snapshot()
    assert times.batches() == 1 and steps.images(snap).tolist() == [2]
    assert steps.seconds_by_step(snap)[0, STEPS.index(DECODE)] >= 0.05
    assert steps.pids(snap) == [os.getpid()]
    cpu = steps.cpu_seconds_by_step(snap)[0]
    # Sleeping takes no CPU (process_time also counts this process's other threads: leave them room).
    assert cpu[STEPS.index(DECODE)] < 0.025 and cpu[STEPS.index(READ)] >= 0
    slow(1)
    clock.batch_done(images=3)  # the wrappers made earlier keep counting into the next batch
    assert steps.seconds_by_step(times.snapshot())[0, STEPS.index(DECODE)] >= 0.10  # both sleeps counted


def test_no_clock_hands_back_what_it_is_given():
    items = iter([1])
    assert NO_CLOCK.timed(DECODE, len) is len and NO_CLOCK.timed_iter(READ, items) is items


def test_profiled_dataset_yields_the_same_batches(packed_many):
    def batches(profiled: bool) -> tuple[list[torch.Tensor], StepTimes | None]:
        ds = ShardDataset(packed_many, batch_size=8, transform="eval", image_size=32)
        ds.step_times = StepTimes(1) if profiled else None
        return [b.images for b in ds], ds.step_times

    plain, _ = batches(False)
    timed, times = batches(True)
    assert len(plain) == len(timed) and all(torch.equal(a, b) for a, b in zip(plain, timed, strict=True))
    assert times is not None and times.batches() == len(timed)
    snap = times.snapshot()
    assert steps.images(snap).sum() == sum(len(b) for b in timed)
    assert (steps.seconds_by_step(snap) > 0).all()


def test_each_worker_writes_its_own_row(packed_many):
    ds = ShardDataset(packed_many, batch_size=8, transform="eval", image_size=32)
    ds.step_times = StepTimes(2)
    loader = make_loader(ds, num_workers=2, persistent_workers=False)
    seen = sum(len(b.images) for b in loader)
    snap = ds.step_times.snapshot()
    pids = steps.pids(snap)
    assert len(set(pids)) == 2 and os.getpid() not in pids
    assert steps.images(snap).sum() == seen and (steps.images(snap) > 0).all()


def run_result(**fields) -> RunResult:
    base = dict(
        pipeline="imgshards",
        workers=2,
        prefetch_factor=2,
        startup_s=1.0,
        seconds=10.0,
        batches=100,
        images=6400,
        passes=1,
        seconds_by_step={"read": 1.0, "decode": 2.0, "augment": 1.0, "collate": 0.0},
        worker_images=[3200, 3200],
        worker_busy_s=[5.0, 5.0],
        cpu_seconds_by_step={"read": 0.5, "decode": 2.0, "augment": 1.0, "collate": 0.0},
        ready_mean=1.0,
        ready_max=4,
        ready_none=0.1,
        wait_s=0.0,
        step_s=9.0,
        main_cpu_s=0.5,
        peak_rss_main=None,
        peak_rss_workers=[],
        pss_total=None,
    )
    return RunResult(**{**base, **fields})


def test_verdict():
    # 640 images/s delivered; the model takes 64 images per 50 ms = 1280 images/s.
    starved = Verdict.of(run_result(wait_s=5.0), step_seconds=0.05, batch_size=64)
    assert starved.bound == "loader" and starved.factor == pytest.approx(2.0)
    assert "loader-bound" in str(starved) and "50%" in str(starved) and "2.0x short" in str(starved)
    # The model takes 64 per 200 ms = 320 images/s; workers busy half the time could feed 1280: 4x.
    fed = Verdict.of(run_result(wait_s=0.1), step_seconds=0.2, batch_size=64)
    assert fed.bound == "compute" and fed.factor == pytest.approx(4.0) and "up to 4.0x faster" in str(fed)
    edge = Verdict.of(run_result(wait_s=10 * LOADER_BOUND_WAIT), step_seconds=0.2, batch_size=64)
    assert edge.bound == "compute"


def test_halves_add_up():
    a = run_result(wait_s=1.0, ready_mean=1.0, peak_rss_workers=[5, None])
    b = run_result(batches=300, images=19200, wait_s=2.0, ready_mean=3.0, peak_rss_workers=[7, 8])
    both = RunResult.combine([a, b])
    assert (both.batches, both.images, both.seconds, both.wait_s, both.segments) == (400, 25600, 20.0, 3.0, 2)
    assert both.ready_mean == pytest.approx(2.5) and both.peak_rss_workers == [7, 8]
    assert both.worker_images == [6400, 6400] and both.seconds_by_step["decode"] == 4.0
    assert both.images_per_s == pytest.approx(1280) and RunResult.combine([a]) is a


def test_cpu_share_tells_an_oversubscribed_machine():
    free = run_result()  # decode and augment: as much CPU as wall time; read: half its wall time
    assert free.cpu_share == pytest.approx(1.0) and not free.oversubscribed
    assert free.images_per_busy_s == pytest.approx(6400 / 10) and free.images_per_free_core_s == 6400 / 4
    crowded = run_result(cpu_seconds_by_step={"read": 0.5, "decode": 1.0, "augment": 0.5, "collate": 0.0})
    assert crowded.cpu_share == pytest.approx(0.5) and crowded.oversubscribed
    assert crowded.images_per_free_core_s == pytest.approx(6400 / 2.5)
    point = BenchPoint(workers=2, imgshards=free, imagefolder=run_result(images=5000))
    assert point.speedup == pytest.approx(1.28) and BenchPoint(workers=2, imgshards=free).speedup is None


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"preset": "fast"}, "expected one of ['train', 'resnet', 'eval']"),
        ({"workers": ()}, "workers must be"),
        ({"workers": (1, 1)}, "each worker count once"),
        ({"seconds": None, "batches": None}, "needs a bound"),
        ({"model_ms": 1.0, "model_images_per_s": 5.0}, "not both"),
        ({"model_ms": 0.0}, "model_ms must be > 0"),
        ({"batch_size": 0}, "batch_size"),
    ],
)
def test_config_is_checked(fields, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        BenchConfig(**fields)


def test_config_step_seconds():
    assert BenchConfig().step_seconds == 0
    assert BenchConfig(model_ms=50).step_seconds == pytest.approx(0.05)
    assert BenchConfig(batch_size=64, model_images_per_s=1280).step_seconds == pytest.approx(0.05)


def resident_bytes(path) -> int:
    out = subprocess.run(
        ["fincore", "--bytes", "--noheadings", "--output", "RES", str(path)],
        check=True,
        capture_output=True,
        text=True,
    )
    return int(out.stdout.split()[0])


@pytest.mark.skipif(
    shutil.which("fincore") is None or not procstats.can_evict(), reason="needs fincore, Linux"
)
def test_evict_drops_files_from_the_page_cache(tmp_path):
    path = tmp_path / "data.bin"
    path.write_bytes(os.urandom(1 << 20))
    path.read_bytes()
    if resident_bytes(path) == 0:
        pytest.skip("this file system does not keep the file in the page cache")
    assert procstats.evict([path, tmp_path / "missing"]) == (1, 1 << 20)
    assert resident_bytes(path) == 0


def test_memory_of_this_process():
    procstats.reset_peak_rss()
    assert procstats.vm_hwm() > 0
    if os.path.exists("/proc/self/smaps_rollup"):
        assert procstats.pss() > 0 and procstats.pss(os.getpid()) > 0


def test_imagefolder_leaves_out_what_pack_rejected(tiny_tree, tmp_path):
    # A truncated JPEG in the tree: pack rejects it, and the ImageFolder run must not stop on it.
    tree = tmp_path / "tree"
    shutil.copytree(tiny_tree, tree)
    victim = next(tree.glob("*/*"))
    victim.write_bytes(victim.read_bytes()[:100])
    dst = tmp_path / "packed"
    pack(tree, dst, PackConfig(workers=1))
    config = BenchConfig(workers=(0,), batch_size=8, seconds=None, batches=12, model_ms=1.0)
    report = bench(dst, config, imagefolder=tree)
    assert report.samples == report.imagefolder_samples == 39
    (point,) = report.points
    # Two pipelines: each ran in two halves of 6 timed batches (A B B A).
    for run in (point.imgshards, point.imagefolder):
        assert run is not None and run.batches == 12 and run.segments == 2
    assert point.imgshards.passes >= 2  # 1 + 6 batches of 8 run past the 5 batches of one pass
    assert point.verdict is not None and point.imagefolder_verdict is not None
    as_json = report.to_json()
    assert as_json["points"][0]["verdict"]["text"] == str(point.verdict)
    assert dataclasses.asdict(report.config)["workers"] == (0,)
