"""Measure a loader the way a training loop sees it: the library side of ``imgshards bench``.

:func:`bench` streams a packed split through :class:`ShardDataset` + :func:`make_loader` (and, to
compare, an ``ImageFolder`` + ``DataLoader`` over the original tree with the same decoder, preset,
batch size and workers) for a bounded time or number of batches, once per worker count, and returns
what it measured. How each figure is taken:

- **images/s** counts the images of the batches received after the first one, over the time from the
  first batch to the last. The wait for the first batch (worker start-up, and for ImageFolder its
  listing of the tree) is reported apart, as ``startup_s``. The run goes on over epoch boundaries.
- **Per worker and per step** (read, decode, augment, collate): each worker times its own steps and
  publishes them once per finished batch in a shared-memory table (:mod:`..pipeline.steps`); the table is
  read at the first batch and at the end, and the difference is the run's. "read" is getting the
  raw bytes: tar parsing, shard interleaving and the shuffle buffer for the shards, ``open`` +
  ``read`` of one file for ImageFolder. A worker's *busy* share is its step seconds over the run's
  wall time; the rest it waited for a free prefetch slot. Each step's CPU time is counted next to
  its wall time: for decode, augment and collate their ratio is the share of the time the workers
  had a core (``cpu_share``, below 1 when the machine runs more busy processes than it has cores);
  for read, wall time well above CPU time is waiting for storage.
- **Batches ready ahead** of the training loop: the batches workers finished (the table's count,
  written just before a batch goes to the DataLoader) minus the batches the loop received, sampled
  each time the loop is about to ask for the next batch. It is bounded by ``workers x
  prefetch_factor``. DataLoader hands batches out in order, so a loop can still wait with batches
  ready (when the next in order is not): the time actually spent blocked in ``next()`` is measured
  apart, as ``wait_s``.
- **A model step** of ``step_seconds`` per batch is simulated in the main process by sleeping, not
  busy-waiting: a GPU training step leaves the host CPU to the workers (the loop only queues kernels
  and waits), and a busy-wait would take a core from them and make the loader look slower than it
  is. The verdict compares the time the loop waited for data with the step's time.
- **The main process's CPU time** over the run (all its threads): what taking batches from the
  DataLoader costs the training process, which competes with the workers for cores.
- **Peak memory**: the main process's ``VmHWM`` (restarted at each run where Linux allows), each
  worker's ``VmHWM`` read before the workers stop, and the PSS of all of them at the end
  (:mod:`.procstats`).
- **Order**: with more than one run (a sweep, a comparison), each runs twice for half its time or
  batches, in the order A B C C B A, and its halves are added up: a drift of the machine's load
  over the benchmark (other jobs starting or stopping) then weighs on every run alike.
- **Cold cache** (``cold=True``): before each run (each half) every shard of the split, and every
  file under the ImageFolder tree, is dropped from the page cache (``posix_fadvise(DONTNEED)``).
  Only the first pass over the data is cold; ``RunResult.passes`` says whether a run went further.
"""

from __future__ import annotations

import gc
import json
import os
import time
from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from time import perf_counter, process_time
from typing import Any

import torch
from torch.utils.data import DataLoader, default_collate
from torchvision.datasets import ImageFolder
from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes, has_file_allowed_extension
from tqdm.auto import tqdm

from imgshards.converter.format.errors import SourceError
from imgshards.converter.format.imageformats import member_name
from imgshards.converter.format.manifest import read_manifest

from ..dataloader import make_loader
from ..dataset import ShardDataset
from ..errors import ConfigError
from ..image.decode import decode
from ..image.presets import Transform, preset
from ..pipeline import steps
from ..pipeline.steps import AUGMENT, COLLATE, DECODE, READ, STEPS, StepClock, StepTimes
from . import procstats
from .config import BenchConfig
from .devicerun import DeviceRun
from .report import BenchPoint, BenchReport, Pipeline, RunResult, Verdict

__all__ = ["BenchConfig", "bench"]

Run = tuple[int, Pipeline]  # (workers, pipeline)


def bench(
    dst: str | os.PathLike[str],
    config: BenchConfig,
    *,
    imagefolder: str | os.PathLike[str] | None = None,
) -> BenchReport:
    """Measure the loader on split ``config.split`` of the packed dataset ``dst``, per worker count.

    Args:
        dst: A packed dataset (holding ``index.json``).
        config: What to measure.
        imagefolder: The original ImageFolder tree of the split, to measure ``ImageFolder`` +
            ``DataLoader`` on it too, right after each imgshards run.

    Raises:
        ManifestError: no packed dataset at ``dst``, or no such split.
        SourceError: ``imagefolder`` is not an ImageFolder tree.
        ConfigError: ``config.cold`` on a platform that cannot drop files from the page cache.

    """
    root = Path(dst)
    split = read_manifest(root).split(config.split)
    if config.cold and not procstats.can_evict():
        raise ConfigError("cold runs drop files from the page cache with os.posix_fadvise (Linux only)")
    src = None if imagefolder is None else Path(os.path.expanduser(imagefolder))
    if src is not None:
        try:
            find_classes(str(src))
        except (FileNotFoundError, NotADirectoryError) as e:
            raise SourceError(f"{src} is not an ImageFolder tree (SRC/<class>/<image>): {e}") from None
    # Every file either pipeline reads, dropped from the page cache before each run when cold.
    files = [str(root / s.name) for s in split.shards]
    if src is not None and config.cold:
        files += procstats.files_under(src)
    rejected = _rejected_paths(root, split.rejects_file, src)
    pipelines: tuple[Pipeline, ...] = ("imgshards",) if src is None else ("imgshards", "imagefolder")
    runs = [(workers, pipeline) for workers in config.workers for pipeline in pipelines]
    parts: dict[tuple[int, Pipeline], list[RunResult]] = {run: [] for run in runs}
    folder_samples = None
    for (workers, pipeline), segment in _schedule(runs, config):
        evicted = _evict(config, files)
        if src is not None and pipeline == "imagefolder":
            result, folder_samples = _run_imagefolder(src, rejected, segment, workers, evicted)
        else:
            result = _run_shards(root, segment, workers, evicted)
        parts[(workers, pipeline)].append(result)
    step = config.step_seconds
    points = []
    for workers in config.workers:
        ours = RunResult.combine(parts[(workers, "imgshards")])
        theirs = RunResult.combine(parts[(workers, "imagefolder")]) if src is not None else None
        points.append(
            BenchPoint(
                workers=workers,
                imgshards=ours,
                imagefolder=theirs,
                verdict=Verdict.of(ours, step_seconds=step, batch_size=config.batch_size) if step else None,
                imagefolder_verdict=(
                    Verdict.of(theirs, step_seconds=step, batch_size=config.batch_size)
                    if step and theirs is not None
                    else None
                ),
            )
        )
    return BenchReport(
        dst=str(root),
        imagefolder_src=None if src is None else str(src),
        samples=split.samples,
        shards=len(split.shards),
        shard_bytes=split.bytes,
        imagefolder_samples=folder_samples,
        cpus=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1,
        config=config,
        points=points,
    )


def _schedule(runs: list[Run], config: BenchConfig) -> list[tuple[Run, BenchConfig]]:
    """Order the runs A B C C B A, each with half the bound, when there are several; one runs whole.

    The machine's load can drift over a benchmark (other jobs start or stop): in this order a drift
    that is linear in time weighs on every run alike, so their ratios hold.
    """
    if len(runs) == 1:
        return [(runs[0], config)]
    seconds = None if config.seconds is None else config.seconds / 2
    batches = config.batches
    first = replace(config, seconds=seconds, batches=None if batches is None else (batches + 1) // 2)
    if batches is not None and batches // 2 == 0:
        return [(run, first) for run in runs]  # one batch each: nothing to split
    second = replace(config, seconds=seconds, batches=None if batches is None else batches // 2)
    return [(run, first) for run in runs] + [(run, second) for run in reversed(runs)]


def _evict(config: BenchConfig, files: Sequence[str]) -> int | None:
    return procstats.evict(files)[1] if config.cold else None


# ---- the two pipelines -----------------------------------------------------------------------


def _run_shards(root: Path, config: BenchConfig, workers: int, evicted: int | None) -> RunResult:
    times = StepTimes(workers)
    decode_on = None if config.decode_on == "workers" else config.decode_on
    decoders = []  # the loader's decoder (not the loader: its workers must stop when the run ends)

    def start() -> Iterable[Any]:
        dataset = ShardDataset(
            root,
            split=config.split,
            batch_size=config.batch_size,
            transform=config.preset,
            seed=config.seed,
            decode_on=decode_on,
        )
        dataset.step_times = times  # before the workers start: they take their copy of the dataset then
        if decode_on == "cuda":
            torch.cuda.reset_peak_memory_stats()
        loader = make_loader(dataset, num_workers=workers, prefetch_factor=config.prefetch_factor)
        decoders.append(loader.decoder)
        return loader

    result = _measure("imgshards", start, times, config, workers, evicted)
    decoder = decoders[-1]
    if decoder is None:
        return result
    return replace(result, device=DeviceRun.of(decoder.settle(), decoder.device))


def _run_imagefolder(
    src: Path, rejected: frozenset[str], config: BenchConfig, workers: int, evicted: int | None
) -> tuple[RunResult, int]:
    times = StepTimes(workers)
    steps = _FolderSteps(times, preset(config.preset))
    samples = [0]

    def start() -> Iterable[Any]:
        dataset = ImageFolder(
            str(src),
            loader=steps.load,
            transform=steps.transform,
            is_valid_file=lambda p: has_file_allowed_extension(p, IMG_EXTENSIONS) and p not in rejected,
            allow_empty=True,
        )
        samples[0] = len(dataset)
        return DataLoader(
            dataset,
            batch_size=config.batch_size,
            shuffle=True,
            num_workers=workers,
            collate_fn=steps.collate,
            pin_memory=torch.cuda.is_available(),
            prefetch_factor=config.prefetch_factor if workers else None,
            persistent_workers=workers > 0,
            generator=torch.Generator().manual_seed(config.seed),
        )

    result = _measure("imagefolder", start, times, config, workers, evicted)
    return result, samples[0]


def _rejected_paths(root: Path, rejects_file: str | None, src: Path | None) -> frozenset[str]:
    """Paths (as ImageFolder spells them) of the files ``pack`` rejected: ImageFolder skips them too.

    So both pipelines read the same images, and an undecodable file does not stop the ImageFolder run.
    """
    if src is None or rejects_file is None or not (root / rejects_file).exists():
        return frozenset()
    out = set()
    with open(root / rejects_file) as f:
        for line in f:
            if line.strip():
                out.add(os.path.join(str(src), *json.loads(line)["path"].split("/")))
    return frozenset(out)


class _FolderSteps:
    """ImageFolder's per-sample hooks (load, transform, collate), timed like ShardDataset's steps."""

    def __init__(self, times: StepTimes, transform: Transform) -> None:
        self.times, self.transform_fn = times, transform
        self._clock: StepClock | None = None  # made in each worker process on its first sample
        self._timed: tuple[Callable[..., Any], ...] = ()

    def _steps(self) -> tuple[StepClock, tuple[Callable[..., Any], ...]]:
        if self._clock is None:
            clock = self._clock = self.times.clock()
            self._timed = (
                clock.timed(READ, _read_file),
                clock.timed(DECODE, decode),
                clock.timed(AUGMENT, self.transform_fn),
                clock.timed(COLLATE, default_collate),
            )
        return self._clock, self._timed

    def load(self, path: str) -> torch.Tensor:
        _, (read, decode_, _, _) = self._steps()
        image: torch.Tensor = decode_(
            read(path), member_name(os.path.splitext(path)[1].lower()), key=path, shard="SRC"
        )
        return image

    def transform(self, image: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self._steps()[1][2](image)
        return out

    def collate(self, samples: list[tuple[torch.Tensor, int]]) -> Any:
        clock, timed = self._steps()
        batch = timed[3](samples)
        clock.batch_done(len(samples))
        return batch


def _read_file(path: str) -> bytearray:
    with open(path, "rb", buffering=0) as f:
        return bytearray(f.read())


# ---- the measuring loop ----------------------------------------------------------------------


def _measure(
    pipeline: Pipeline,
    start: Callable[[], Iterable[Any]],
    times: StepTimes,
    config: BenchConfig,
    workers: int,
    evicted: int | None,
) -> RunResult:
    procstats.reset_peak_rss()
    began = perf_counter()
    loader = start()
    passes = [0]
    batches = _endless(loader, passes)
    try:
        next(batches)
        first = perf_counter()
        before = times.snapshot()
        main_cpu = process_time()
        consumed, count, images, wait, stepped = 1, 0, 0, 0.0, 0.0
        ready: list[int] = []
        step = config.step_seconds
        deadline = first + config.seconds if config.seconds is not None else float("inf")
        limit = config.batches if config.batches is not None else float("inf")
        now = first
        total = config.batches * config.batch_size if config.batches is not None else None
        label = f"{pipeline} {workers} worker{'s' * (workers != 1)}"
        with tqdm(total=total, desc=label, unit=" img", disable=not config.progress, leave=False) as bar:
            while count < limit and now < deadline:
                if step:
                    stepped += _sleep(step)
                ready.append(times.batches() - consumed)
                asked = perf_counter()
                batch = next(batches)
                now = perf_counter()
                wait += now - asked
                consumed, count = consumed + 1, count + 1
                images += len(batch[1])
                bar.update(len(batch[1]))
                del batch  # let a recycling loader have the buffer back
        after = times.snapshot()
        main_cpu = process_time() - main_cpu
        main_peak = procstats.vm_hwm()
        worker_pids = [p for p in steps.pids(after) if p and p != os.getpid()]
        worker_peaks = [procstats.vm_hwm(p) for p in worker_pids]
        pss_values = [procstats.pss(), *(procstats.pss(p) for p in worker_pids)]
    finally:
        batches.close()
        del loader
        gc.collect()  # shut the workers down now, before the next run starts its own
    run = after - before
    per_step = steps.seconds_by_step(run)
    return RunResult(
        pipeline=pipeline,
        workers=workers,
        prefetch_factor=config.prefetch_factor if workers else 0,
        startup_s=first - began,
        seconds=now - first,
        batches=count,
        images=images,
        passes=passes[0],
        seconds_by_step=dict(zip(STEPS, per_step.sum(0).tolist(), strict=True)),
        cpu_seconds_by_step=dict(zip(STEPS, steps.cpu_seconds_by_step(run).sum(0).tolist(), strict=True)),
        worker_images=[int(n) for n in steps.images(run).tolist()],
        worker_busy_s=per_step.sum(1).tolist(),
        ready_mean=sum(ready) / len(ready) if ready else 0.0,
        ready_max=max(ready, default=0),
        ready_none=sum(r <= 0 for r in ready) / len(ready) if ready else 0.0,
        wait_s=wait,
        step_s=stepped,
        main_cpu_s=main_cpu,
        peak_rss_main=main_peak,
        peak_rss_workers=worker_peaks,
        pss_total=None if None in pss_values else sum(v for v in pss_values if v is not None),
        evicted_bytes=evicted,
    )


def _endless(loader: Iterable[Any], passes: list[int]) -> Generator[Any, None, None]:
    """Batches of pass after pass over ``loader``; ``passes[0]`` counts the passes started."""
    while True:
        passes[0] += 1
        empty = True
        for batch in loader:
            empty = False
            yield batch
        if empty:
            raise ConfigError("the loader yields no batch: is the split empty?")


def _sleep(seconds: float) -> float:
    """Sleep ``seconds`` (the simulated step); return the time it really took."""
    start = perf_counter()
    time.sleep(seconds)
    return perf_counter() - start
