"""``imgshards bench DST``: is data loading the bottleneck, and which knob moves it."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from imgshards.converter.format.locate import redact_url

from .exits import CantRun
from .options import format_bytes, plural, workers_option
from .storage import PathOrURL

if TYPE_CHECKING:
    from imgshards.loader.profiling.devicerun import DeviceRun
    from imgshards.loader.profiling.report import BenchPoint, BenchReport, RunResult

__all__ = ["PRESETS", "bench"]

# imgshards.loader.PRESETS, written out (a test holds them equal): the loader is imported only when
# the command runs, because importing it (torch) takes seconds and every command pays for the
# imports of all.
PRESETS = ("train", "resnet", "eval")
DECODE_ON = ("workers", "cpu", "cuda")  # imgshards.loader.profiling.devicerun.DECODE_ON
DEFAULT_SECONDS = 20.0


if TYPE_CHECKING:  # click's ParamType is generic from 8.4: the floor, 8.1, cannot subscript it
    _CountsParam = click.ParamType[tuple[int, ...]]
else:
    _CountsParam = click.ParamType


class WorkerCounts(_CountsParam):
    """Worker counts written ``1,2,4``."""

    name = "counts"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> tuple[int, ...]:
        """Parse ``value`` into a tuple of distinct worker counts >= 0."""
        if isinstance(value, tuple):
            return value
        try:
            counts = tuple(int(part) for part in str(value).split(","))
        except ValueError:
            self.fail(f"{value!r} is not a list of worker counts; write it like 1,2,4", param, ctx)
        if any(c < 0 for c in counts) or len(set(counts)) != len(counts):
            self.fail(f"{value!r}: worker counts are distinct integers >= 0, like 1,2,4", param, ctx)
        return counts


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@click.command()
@click.argument("dst", type=PathOrURL(file_okay=True))
@click.option("--split", default="train", show_default=True, help="Split to read.")
@click.option(
    "--preset", type=click.Choice(PRESETS), default="train", show_default=True, help="Augmentation."
)
@click.option(
    "--batch-size", type=click.IntRange(min=1), default=64, show_default=True, help="Images per batch."
)
@workers_option("DataLoader workers [default: all CPUs].", min_workers=0)
@click.option(
    "--prefetch-factor",
    type=click.IntRange(min=1),
    default=2,
    show_default=True,
    help="Batches per worker ahead.",
)
@click.option(
    "--seconds",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help=f"Time each run this long after its first batch [default: {DEFAULT_SECONDS:g}, unless --batches].",
)
@click.option("--batches", type=click.IntRange(min=1), default=None, help="Time each run over N batches.")
@click.option(
    "--model-ms",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Simulate a training step of X ms per batch (sleeps in the main process).",
)
@click.option(
    "--model-images-per-s",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Or simulate a model that takes Y images a second.",
)
@click.option("--sweep-workers", type=WorkerCounts(), default=None, help="Run once per worker count: 1,2,4.")
@click.option(
    "--plot",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="With --sweep-workers: draw images/s against workers into this PNG (needs matplotlib).",
)
@click.option(
    "--compare-imagefolder",
    "src",
    metavar="SRC",
    type=click.Path(path_type=Path, exists=True, file_okay=False),
    default=None,
    help="Also measure torchvision ImageFolder + DataLoader on the original tree SRC.",
)
@click.option(
    "--decode-on",
    type=click.Choice(DECODE_ON),
    default="workers",
    show_default=True,
    help="Decode and augment in the DataLoader workers, or in the training process (cpu, cuda: nvjpeg).",
)
@click.option("--cold", is_flag=True, help="Drop the shards (and SRC) from the page cache before each run.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@click.option(
    "--progress/--no-progress",
    default=None,
    help="Progress bar on stderr [default: when stderr is a terminal].",
)
def bench(
    dst: Path | str,
    workers: int | None,
    sweep_workers: tuple[int, ...] | None,
    seconds: float | None,
    plot: Path | None,
    src: Path | None,
    as_json: bool,
    **options: Any,
) -> None:
    """Stream the packed dataset DST through the loader and tell where the time goes.

    Prints images/s, per-worker images/s, the workers' time split into read / decode / augment /
    collate, the batches ready ahead of the training loop, and peak memory. With --model-ms or
    --model-images-per-s, says whether training would be loader-bound or compute-bound.
    """
    if isinstance(dst, str):  # a URL: the page-cache and reject accounting are a local folder's
        raise CantRun(
            f"imgshards bench measures a local dataset, not the URL {redact_url(str(dst))}: copy it into a "
            "folder first (aws s3 sync, gsutil rsync...), then `imgshards bench FOLDER`"
        )
    if workers is not None and sweep_workers is not None:
        raise click.UsageError("--workers and --sweep-workers both set the worker count; give one")
    if options["model_ms"] is not None and options["model_images_per_s"] is not None:
        raise click.UsageError("give the model's cost as --model-ms or as --model-images-per-s, not both")
    if plot is not None:
        if sweep_workers is None:
            raise click.UsageError("--plot draws a sweep; add --sweep-workers, e.g. --sweep-workers 1,2,4")
        if not plot.parent.is_dir():
            raise click.UsageError(f"--plot: no directory {plot.parent} to write {plot.name} into")
        try:
            import matplotlib  # noqa: F401  (checked before running: a sweep takes minutes)
        except ImportError:
            raise CantRun(
                "--plot needs matplotlib, the 'plot' extra: pip install 'imgshards[plot]'"
            ) from None
    if seconds is None and options["batches"] is None:
        seconds = DEFAULT_SECONDS
    if options["progress"] is None:
        options["progress"] = sys.stderr.isatty()
    from imgshards.loader.profiling import BenchConfig
    from imgshards.loader.profiling import bench as run_bench
    from imgshards.loader.profiling.report import plot_sweep

    counts = sweep_workers or (workers if workers is not None else _cpus(),)
    try:
        config = BenchConfig(workers=counts, seconds=seconds, **options)
    except ValueError as e:
        raise click.UsageError(str(e)) from e
    report = run_bench(dst, config, imagefolder=src)
    if plot is not None:
        plot_sweep(report, plot)
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=1))
        return
    print_report(report)
    if plot is not None:
        click.echo(f"plot: {plot}")


# ---- the report -------------------------------------------------------------------------------


def print_report(report: BenchReport) -> None:
    """Print the header, a table per worker count, the verdicts, and the scaling of a sweep."""
    config = report.config
    click.echo(
        f"{report.dst}: split {config.split!r}, {plural(report.samples, 'image')} in "
        f"{plural(report.shards, 'shard')} "
        f"({format_bytes(report.shard_bytes)}); preset {config.preset!r}, batch {config.batch_size}, "
        f"prefetch {config.prefetch_factor}; {report.cpus} CPUs"
    )
    if report.imagefolder_src is not None:
        click.echo(
            f"compared with torchvision ImageFolder + DataLoader on {report.imagefolder_src} "
            f"({report.imagefolder_samples or 0:,} images): same decoder, preset, batch size and workers"
        )
    if config.decode_on != "workers":
        click.echo(
            f"decoded in the training process on {config.decode_on} (decode_on): the workers only read, "
            "shuffle and batch raw bytes"
        )
    if config.step_seconds:
        click.echo(
            f"simulated model: {config.step_seconds * 1000:.1f} ms per batch "
            f"({config.batch_size / config.step_seconds:,.0f} images/s), slept in the main process"
        )
    if config.cold:
        click.echo("cold: the files read were dropped from the page cache before each run")
    for point in report.points:
        click.echo()
        _print_point(point)
    if len(report.points) > 1:
        click.echo()
        _print_scaling(report)


def _print_point(point: BenchPoint) -> None:
    runs = [point.imgshards] + ([point.imagefolder] if point.imagefolder is not None else [])
    head = f"{point.workers} worker{'s' * (point.workers != 1)}"
    rows: list[list[str]] = [[head, "imgshards"] + (["ImageFolder"] if len(runs) > 1 else [])]
    rows.append(["images/s", *(f"{r.images_per_s:,.0f}" for r in runs)])
    if point.speedup is not None:
        rows[-1].append(f"imgshards {point.speedup:.2f}x")
    rows.append(["startup (to the first batch)", *(f"{r.startup_s:.2f} s" for r in runs)])
    rows.append(["timed", *(_timed(r) for r in runs)])
    rows.append(["per worker images/s", *(_per_worker(r) for r in runs)])
    rows.append(["one worker flat out", *(_flat_out(r) for r in runs)])
    rows.append(["workers busy", *(f"{r.busy_share:.0%} of the time" for r in runs)])
    rows.append(["workers had a core", *(f"{r.cpu_share:.0%} of busy time" for r in runs)])
    for k, step in enumerate(runs[0].seconds_by_step):
        label = "time in workers: " + step if k == 0 else " " * len("time in workers: ") + step
        rows.append([label, *(_step(r, step) for r in runs)])
    rows.append(["batches ready ahead (mean/max)", *(_ready(r) for r in runs)])
    rows.append(["loop waited for data", *(_waited(r) for r in runs)])
    rows.append(["main process CPU", *(_main_cpu(r) for r in runs)])
    rows.append(["peak RSS main / per worker", *(_rss(r) for r in runs)])
    rows.append(["PSS of all processes (end)", *(_bytes(r.pss_total) for r in runs)])
    if point.imgshards.device is not None:
        rows += _device_rows(point.imgshards.device)
    if any(r.evicted_bytes is not None for r in runs):
        rows.append(["dropped from page cache", *(_bytes(r.evicted_bytes) for r in runs)])
    _print_table(rows)
    crowded = [r for r in runs if r.oversubscribed]
    if crowded:
        share = min(r.cpu_share for r in crowded)
        click.secho(
            f"note: workers had a core only {share:.0%} of their busy time: this machine runs more busy "
            "processes than it has cores (other jobs, or more workers than CPUs), so these rates "
            "understate what the workers do with a core each",
            fg="yellow",
        )
    if point.verdict is not None:
        click.echo(f"verdict: {point.verdict}")
    if point.imagefolder_verdict is not None:
        click.echo(f"verdict (ImageFolder): {point.imagefolder_verdict}")


def _device_rows(d: DeviceRun) -> list[list[str]]:
    """The training process's decoder: time per batch on the device, fallbacks, memory."""
    rows = [[f"decoded on {d.device}: decode", f"{d.ms_per_batch('decode'):.1f} ms/batch"]]
    rows += [
        [" " * len(f"decoded on {d.device}: ") + s, f"{d.ms_per_batch(s):.1f} ms/batch"]
        for s in ("augment", "normalize")
    ]
    rows.append(
        [
            "decode calls / CPU fallbacks",
            f"{d.decode_calls / max(d.batches, 1):.1f} per batch / {d.cpu_fallback}",
        ]
    )
    memory = f"{_bytes(d.peak_bytes)} (bound {_bytes(d.bound_bytes)})"
    rows.append(["loader memory on the device", memory])
    if d.cuda_max_allocated is not None:
        rows.append(["GPU memory allocated (peak)", _bytes(d.cuda_max_allocated)])
    if d.cuda_max_reserved is not None:
        rows.append(["GPU memory reserved (peak)", _bytes(d.cuda_max_reserved)])
    return rows


def _print_scaling(report: BenchReport) -> None:
    compare = all(p.imagefolder is not None for p in report.points)
    rows = [["scaling: workers", "images/s", "vs first", "per worker", "busy", "had a core"]]
    if compare:
        rows[0] += ["ImageFolder", "imgshards / IF"]
    first = report.points[0].imgshards.images_per_s
    for p in report.points:
        r = p.imgshards
        row = [
            str(p.workers),
            f"{r.images_per_s:,.0f}",
            f"{r.images_per_s / first:.2f}x" if first else "-",
            f"{r.images_per_s / max(p.workers, 1):,.0f}",
            f"{r.busy_share:.0%}",
            f"{r.cpu_share:.0%}",
        ]
        if compare and p.imagefolder is not None:
            row += [f"{p.imagefolder.images_per_s:,.0f}", f"{p.speedup or 0:.2f}x"]
        rows.append(row)
    _print_table(rows)


def _timed(r: RunResult) -> str:
    halves = f", {r.segments} halves" if r.segments > 1 else ""
    return f"{r.batches:,} batches, {r.seconds:.1f} s, {r.passes} pass{'es' * (r.passes != 1)}{halves}"


def _flat_out(r: RunResult) -> str:
    return f"{r.images_per_busy_s:,.0f} images/s, {r.images_per_free_core_s:,.0f} on a free core"


def _per_worker(r: RunResult) -> str:
    rates = r.worker_images_per_s
    return " ".join(f"{v:,.0f}" for v in rates[:8]) + (" ..." if len(rates) > 8 else "")


def _step(r: RunResult, step: str) -> str:
    busy = sum(r.seconds_by_step.values())
    share = r.seconds_by_step[step] / busy if busy else 0.0
    return f"{share:4.0%}  {r.ms_per_image(step):5.2f} ms/image, CPU {r.ms_per_image_cpu(step):5.2f}"


def _ready(r: RunResult) -> str:
    if not r.ready_capacity:
        return "- (no workers)"
    return f"{r.ready_mean:.1f} / {r.ready_max} of {r.ready_capacity}; none {r.ready_none:.0%} of asks"


def _waited(r: RunResult) -> str:
    per_batch = r.wait_s / r.batches * 1000 if r.batches else 0.0
    return f"{r.wait_share:.0%} of the time, {per_batch:.1f} ms/batch"


def _main_cpu(r: RunResult) -> str:
    share = r.main_cpu_s / r.seconds if r.seconds else 0.0
    per_batch = r.main_cpu_s / r.batches * 1000 if r.batches else 0.0
    return f"{share:.0%} of a core, {per_batch:.1f} ms/batch"


def _rss(r: RunResult) -> str:
    workers = [w for w in r.peak_rss_workers if w is not None]
    main = _bytes(r.peak_rss_main)
    return f"{main} / {_bytes(max(workers))}" if workers else main


def _bytes(n: int | None) -> str:
    return "?" if n is None else format_bytes(n)


def _print_table(rows: list[list[str]]) -> None:
    """Print ``rows`` in columns: the first row a heading, the others' labels indented under it."""
    rows = [rows[0]] + [["  " + row[0], *row[1:]] for row in rows[1:]]
    widths = [max(len(row[i]) for row in rows if i < len(row)) for i in range(max(map(len, rows)))]
    for row in rows:
        cells = [row[0].ljust(widths[0])] + [c.rjust(widths[i + 1]) for i, c in enumerate(row[1:])]
        click.echo("  ".join(cells).rstrip())
