"""What ``imgshards bench`` measured: per-run results, the verdict on a simulated model, the sweep plot.

:func:`imgshards.loader.profiling.bench` fills these; how each figure is taken is told there. Every
type converts to plain JSON values (``to_json``), derived figures included.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from itertools import zip_longest
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from imgshards.converter.format.imageformats import PNG

from .devicerun import DeviceRun

if TYPE_CHECKING:
    from .config import BenchConfig

__all__ = [
    "CPU_SHARE_LOW",
    "LOADER_BOUND_WAIT",
    "BenchPoint",
    "BenchReport",
    "Pipeline",
    "RunResult",
    "Verdict",
    "WorkerRounds",
    "plot_sweep",
]

Pipeline = Literal["imgshards", "imagefolder"]

# A training loop that waits for data longer than this share of its time is called loader-bound.
LOADER_BOUND_WAIT = 0.05
# Workers that got a core for less than this share of their busy time ran on an oversubscribed
# machine (other jobs, or more busy processes than cores): their rates understate a free machine's.
CPU_SHARE_LOW = 0.8
# The steps that only compute (reading also waits for storage).
_COMPUTE = ("decode", "augment", "collate")


@dataclass(frozen=True, kw_only=True)
class RunResult:
    """What one run of one pipeline measured (see the module docstring for how)."""

    pipeline: Pipeline
    workers: int
    prefetch_factor: int
    startup_s: float
    seconds: float
    batches: int
    images: int
    passes: int
    seconds_by_step: dict[str, float]
    cpu_seconds_by_step: dict[str, float]
    worker_images: list[int]
    worker_busy_s: list[float]
    ready_mean: float
    ready_max: int
    ready_none: float
    wait_s: float
    step_s: float
    main_cpu_s: float
    peak_rss_main: int | None
    peak_rss_workers: list[int | None]
    pss_total: int | None
    evicted_bytes: int | None = None
    segments: int = 1
    device: DeviceRun | None = None  # with decode_on: what the training process's decoder did

    @classmethod
    def combine(cls, parts: Sequence[RunResult]) -> RunResult:
        """Add up runs of one pipeline and worker count (the halves of a bench's schedule) into one."""
        if len(parts) == 1:
            return parts[0]
        first = parts[0]
        batches = sum(p.batches for p in parts)

        def by_batch(values: Iterable[float]) -> float:  # one ready sample per timed batch
            return (
                sum(v * p.batches for v, p in zip(values, parts, strict=True)) / batches if batches else 0.0
            )

        return cls(
            pipeline=first.pipeline,
            workers=first.workers,
            prefetch_factor=first.prefetch_factor,
            startup_s=sum(p.startup_s for p in parts) / len(parts),
            seconds=sum(p.seconds for p in parts),
            batches=batches,
            images=sum(p.images for p in parts),
            passes=max(p.passes for p in parts),
            seconds_by_step={k: sum(p.seconds_by_step[k] for p in parts) for k in first.seconds_by_step},
            cpu_seconds_by_step={
                k: sum(p.cpu_seconds_by_step[k] for p in parts) for k in first.cpu_seconds_by_step
            },
            worker_images=[sum(n) for n in zip(*(p.worker_images for p in parts), strict=True)],
            worker_busy_s=[sum(s) for s in zip(*(p.worker_busy_s for p in parts), strict=True)],
            ready_mean=by_batch(p.ready_mean for p in parts),
            ready_max=max(p.ready_max for p in parts),
            ready_none=by_batch(p.ready_none for p in parts),
            wait_s=sum(p.wait_s for p in parts),
            step_s=sum(p.step_s for p in parts),
            main_cpu_s=sum(p.main_cpu_s for p in parts),
            peak_rss_main=_largest(p.peak_rss_main for p in parts),
            peak_rss_workers=[
                _largest(peaks) for peaks in zip_longest(*(p.peak_rss_workers for p in parts), fillvalue=None)
            ],
            pss_total=_largest(p.pss_total for p in parts),
            evicted_bytes=first.evicted_bytes,
            segments=sum(p.segments for p in parts),
            device=DeviceRun.combine([p.device for p in parts if p.device]) if first.device else None,
        )

    @property
    def images_per_s(self) -> float:
        """Images received per second, from the first batch on."""
        return self.images / self.seconds if self.seconds > 0 else 0.0

    @property
    def worker_images_per_s(self) -> list[float]:
        """Images each worker finished per second of the run."""
        return [n / self.seconds if self.seconds > 0 else 0.0 for n in self.worker_images]

    def ms_per_image(self, step: str) -> float:
        """Milliseconds of worker time per image spent in ``step`` (one of ``STEPS``)."""
        made = sum(self.worker_images)
        return self.seconds_by_step[step] / made * 1000 if made else 0.0

    @property
    def images_per_busy_s(self) -> float:
        """Images a worker makes per second of its step time: one worker's rate flat out."""
        busy = sum(self.worker_busy_s)
        return sum(self.worker_images) / busy if busy > 0 else 0.0

    def ms_per_image_cpu(self, step: str) -> float:
        """Milliseconds of CPU time per image spent in ``step``."""
        made = sum(self.worker_images)
        return self.cpu_seconds_by_step[step] / made * 1000 if made else 0.0

    @property
    def images_per_free_core_s(self) -> float:
        """One worker's rate with a core to itself.

        Images per second of reading (wall time: it can wait for storage) plus the CPU time of
        decoding, augmenting and collating.
        """
        seconds = self.seconds_by_step["read"] + sum(self.cpu_seconds_by_step[k] for k in _COMPUTE)
        return sum(self.worker_images) / seconds if seconds > 0 else 0.0

    @property
    def cpu_share(self) -> float:
        """CPU time over wall time of decoding, augmenting and collating: the share of it workers had a core.

        About 1 on a machine with a free core per worker; above 1 when a process runs threads (torch
        does, in the main process, with no workers). Reading is left out: it also waits for storage.
        """
        wall = sum(self.seconds_by_step[k] for k in _COMPUTE)
        return sum(self.cpu_seconds_by_step[k] for k in _COMPUTE) / wall if wall > 0 else 0.0

    @property
    def oversubscribed(self) -> bool:
        """Whether the workers waited for a core much of their busy time (see :data:`CPU_SHARE_LOW`)."""
        return 0 < self.cpu_share < CPU_SHARE_LOW

    @property
    def busy_share(self) -> float:
        """Mean share of the run the workers spent in their steps (the rest they waited), at most 1.

        A batch counts whole in the run it is finished in, so on a short run the batches in progress at
        the first batch can push the raw figure past 1; it is capped there.
        """
        if not self.worker_busy_s or self.seconds <= 0:
            return 0.0
        return min(1.0, sum(self.worker_busy_s) / len(self.worker_busy_s) / self.seconds)

    @property
    def wait_share(self) -> float:
        """Share of the run the training loop spent blocked waiting for the next batch."""
        return self.wait_s / self.seconds if self.seconds > 0 else 0.0

    @property
    def ready_capacity(self) -> int:
        """The most batches a DataLoader lets its workers prepare ahead."""
        return self.workers * self.prefetch_factor

    def to_json(self) -> dict[str, Any]:
        """The fields, with the derived figures, as plain JSON values."""
        return {
            **asdict(self),
            "images_per_s": self.images_per_s,
            "worker_images_per_s": self.worker_images_per_s,
            "images_per_busy_s": self.images_per_busy_s,
            "images_per_free_core_s": self.images_per_free_core_s,
            "cpu_share": self.cpu_share,
            "oversubscribed": self.oversubscribed,
            "busy_share": self.busy_share,
            "wait_share": self.wait_share,
            "ready_capacity": self.ready_capacity,
        }


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """Whether a training step of the simulated cost would wait for data, and by how much.

    ``factor``: for ``"loader"``, how many times more images a second the model could take than the
    loader delivered; for ``"compute"``, how many times faster a model could be before the loader
    limits it, estimated as the delivered rate over the workers' busy share. That estimate is an upper
    bound: it assumes a worker runs as fast fully loaded as when mostly idle, and workers busy all
    the time slow each other down where they share cores (with each other, the training process or
    other jobs).
    """

    bound: Literal["loader", "compute"]
    wait_share: float
    busy_share: float
    factor: float
    model_images_per_s: float
    delivered_images_per_s: float

    @classmethod
    def of(
        cls, run: RunResult, *, step_seconds: float, batch_size: int, delivered: float | None = None
    ) -> Verdict:
        """Judge ``run``, made with a simulated step of ``step_seconds`` per batch of ``batch_size``.

        ``delivered``: the images/s to judge, when not ``run``'s own (:meth:`WorkerRounds.verdict`
        passes the median of its rounds, the rate its chart shows).
        """
        model = batch_size / step_seconds
        delivered = run.images_per_s if delivered is None else delivered
        if run.wait_share > LOADER_BOUND_WAIT:
            return cls(
                bound="loader",
                wait_share=run.wait_share,
                busy_share=run.busy_share,
                factor=model / delivered if delivered else float("inf"),
                model_images_per_s=model,
                delivered_images_per_s=delivered,
            )
        busy = run.busy_share
        return cls(
            bound="compute",
            wait_share=run.wait_share,
            busy_share=busy,
            factor=delivered / busy / model if busy > 0 else float("inf"),
            model_images_per_s=model,
            delivered_images_per_s=delivered,
        )

    def __str__(self) -> str:
        waited = f"the step waited for data {self.wait_share:.0%} of the time"
        if self.bound == "loader":
            return (
                f"loader-bound: {waited}; the model could take {self.model_images_per_s:,.0f} images/s, "
                f"the loader delivers {self.delivered_images_per_s:,.0f} ({self.factor:.1f}x short)"
            )
        return (
            f"compute-bound: {waited}; the workers were busy {self.busy_share:.0%} of it: room for a "
            f"model up to {self.factor:.1f}x faster than {self.model_images_per_s:,.0f} images/s "
            "(at most: busy workers slow each other where they share cores)"
        )


@dataclass(frozen=True)
class WorkerRounds:
    """One worker count's runs over the rounds of a sweep, and the one rate they are told by.

    The rate is the median of the rounds' images/s: the chart, the table and the verdict all read
    :attr:`images_per_s`, so they cannot say different numbers. The shares (the loop's wait, the
    workers' busy time, their steps) are of all rounds added up (:attr:`combined`).
    """

    workers: int
    runs: tuple[RunResult, ...]

    @classmethod
    def of(cls, reports: Iterable[BenchReport]) -> dict[int, WorkerRounds]:
        """Worker count -> its imgshards runs over ``reports`` (one report a round), in sweep order."""
        runs: dict[int, list[RunResult]] = {}
        for report in reports:
            for point in report.points:
                runs.setdefault(point.workers, []).append(point.imgshards)
        return {w: cls(w, tuple(r)) for w, r in runs.items()}

    @property
    def combined(self) -> RunResult:
        """The rounds added up into one run (:meth:`RunResult.combine`)."""
        return RunResult.combine(self.runs)

    @property
    def images_per_s(self) -> float:
        """The median of the rounds' images/s."""
        return statistics.median(r.images_per_s for r in self.runs)

    @property
    def spread(self) -> tuple[float, float]:
        """The lowest and the highest round's images/s."""
        rates = [r.images_per_s for r in self.runs]
        return min(rates), max(rates)

    def verdict(self, *, step_seconds: float, batch_size: int) -> Verdict:
        """:meth:`Verdict.of` the rounds added up, judging the median rate (:attr:`images_per_s`)."""
        return Verdict.of(
            self.combined, step_seconds=step_seconds, batch_size=batch_size, delivered=self.images_per_s
        )


@dataclass(frozen=True, kw_only=True)
class BenchPoint:
    """The runs at one worker count, and their verdicts when a model step was simulated."""

    workers: int
    imgshards: RunResult
    imagefolder: RunResult | None = None
    verdict: Verdict | None = None
    imagefolder_verdict: Verdict | None = None

    @property
    def speedup(self) -> float | None:
        """The imgshards images/s over ImageFolder's, when compared."""
        if self.imagefolder is None or not self.imagefolder.images_per_s:
            return None
        return self.imgshards.images_per_s / self.imagefolder.images_per_s


@dataclass(frozen=True, kw_only=True)
class BenchReport:
    """Everything :func:`bench` measured, in the order it ran."""

    dst: str
    imagefolder_src: str | None
    samples: int
    shards: int
    shard_bytes: int
    imagefolder_samples: int | None
    cpus: int
    config: BenchConfig
    points: list[BenchPoint] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The report as plain JSON values (derived figures included)."""
        config = asdict(self.config)
        config["step_seconds"] = self.config.step_seconds
        return {
            "dst": self.dst,
            "imagefolder_src": self.imagefolder_src,
            "samples": self.samples,
            "shards": self.shards,
            "shard_bytes": self.shard_bytes,
            "imagefolder_samples": self.imagefolder_samples,
            "cpus": self.cpus,
            "config": config,
            "points": [
                {
                    "workers": p.workers,
                    "imgshards": p.imgshards.to_json(),
                    "imagefolder": p.imagefolder.to_json() if p.imagefolder else None,
                    "speedup": p.speedup,
                    "verdict": _verdict_json(p.verdict),
                    "imagefolder_verdict": _verdict_json(p.imagefolder_verdict),
                }
                for p in self.points
            ],
        }


def _largest(values: Iterable[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def _verdict_json(v: Verdict | None) -> dict[str, Any] | None:
    return None if v is None else {**asdict(v), "text": str(v)}


def plot_sweep(report: BenchReport, path: str | Path) -> None:
    """Draw images/s against DataLoader workers for each pipeline of ``report`` into a PNG at ``path``.

    Also drawn: linear scaling from the smallest worker count, the number of CPUs, the rate the
    simulated model takes (when there is one), and by each point the share of their busy time the
    workers had a core (low: the machine was busy with other work, or workers outnumber cores).

    Raises:
        ImportError: matplotlib (the ``plot`` extra: ``pip install 'imgshards[plot]'``) is missing.

    """
    from matplotlib.figure import Figure  # the optional `plot` extra; pyplot's global state not needed

    config = report.config
    workers = [p.workers for p in report.points]
    ours = [p.imgshards.images_per_s for p in report.points]
    fig = Figure(figsize=(6.4, 4.0), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    ax.plot(workers, ours, "o-", color="tab:blue", label="imgshards")
    for p in report.points:
        # Each label on the outer side of its point, so the two pipelines' labels do not collide.
        above = p.imagefolder is None or p.imgshards.images_per_s >= p.imagefolder.images_per_s
        _label_cpu_share(ax, p.imgshards, "tab:blue", above)
        if p.imagefolder is not None:
            _label_cpu_share(ax, p.imagefolder, "tab:orange", not above)
    folder = [p.imagefolder.images_per_s for p in report.points if p.imagefolder is not None]
    if len(folder) == len(workers):
        ax.plot(workers, folder, "s-", color="tab:orange", label="ImageFolder + DataLoader")
    base = next(((w, r) for w, r in zip(workers, ours, strict=True) if w > 0), None)
    if base is not None and len(workers) > 1:
        ideal = [base[1] * max(w, 1) / base[0] for w in workers]
        ax.plot(workers, ideal, ":", color="0.5", label=f"linear from {base[0]} worker{'s' * (base[0] != 1)}")
    if config.step_seconds:
        ax.axhline(config.batch_size / config.step_seconds, color="tab:red", lw=1, label="simulated model")
    ax.axvline(report.cpus, color="0.7", ls="--", lw=1)
    ax.annotate(
        f"{report.cpus} CPUs", (report.cpus, 0), xytext=(3, 3), textcoords="offset points", fontsize=8
    )
    ax.set_xticks(workers)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("DataLoader workers (by each point: share of busy time the workers had a core)", fontsize=9)
    ax.set_ylabel("images/s")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    cold = ", cold cache" if config.cold else ""
    ax.set_title(
        f"imgshards bench: preset {config.preset!r}, batch {config.batch_size}, "
        f"{report.samples:,} images{cold}",
        fontsize=10,
    )
    fig.savefig(path, format=PNG.name)


def _label_cpu_share(ax: Any, run: RunResult, color: str, above: bool) -> None:
    ax.annotate(
        f"{run.cpu_share:.0%}",
        (run.workers, run.images_per_s),
        xytext=(0, 6 if above else -12),
        textcoords="offset points",
        ha="center",
        fontsize=7,
        color=color,
    )
