"""notebooks/loader.ipynb's chart, table and verdict tell one rate per worker count: the rounds' median.

A trial gave 311 images/s for 1 worker and 279 for 2 in the chart (medians), and a verdict naming 2
workers "the best" at 323 (the rounds added up). These are the notebook's figures, built by the
helper it calls (:class:`~imgshards.loader.profiling.report.WorkerRounds`) from runs of known rates.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from imgshards.loader.profiling import BenchConfig
from imgshards.loader.profiling.report import BenchPoint, BenchReport, RunResult, WorkerRounds

MODEL = 2500.0  # images/s: 64 images a step of 25.6 ms
STEP, BATCH = 64 / MODEL, 64


def run(workers: int, images: int, seconds: float = 10.0) -> RunResult:
    """A run of ``images`` in ``seconds`` whose training loop waited half the time (loader-bound)."""
    return RunResult(
        pipeline="imgshards",
        workers=workers,
        prefetch_factor=2,
        startup_s=1.0,
        seconds=seconds,
        batches=images // 64,
        images=images,
        passes=1,
        seconds_by_step={"read": 1.0, "decode": 2.0, "augment": 1.0, "collate": 0.0},
        cpu_seconds_by_step={"read": 0.5, "decode": 2.0, "augment": 1.0, "collate": 0.0},
        worker_images=[images // workers] * workers,
        worker_busy_s=[seconds] * workers,
        ready_mean=0.0,
        ready_max=1,
        ready_none=0.9,
        wait_s=seconds / 2,
        step_s=seconds / 2,
        main_cpu_s=0.5,
        peak_rss_main=None,
        peak_rss_workers=[],
        pss_total=None,
    )


def rounds_of_the_trial() -> dict[int, WorkerRounds]:
    """Three rounds of 10 s: 1 worker at 300, 311, 320 images/s; 2 workers at 250, 279, 440."""
    reports = []
    for one, two in ((3000, 2500), (3110, 2790), (3200, 4400)):
        report = BenchReport(
            dst="shards",
            imagefolder_src=None,
            samples=1000,
            shards=4,
            shard_bytes=1 << 20,
            imagefolder_samples=None,
            cpus=2,
            config=BenchConfig(workers=(1, 2), model_images_per_s=MODEL),
        )
        report.points.extend(
            [BenchPoint(workers=1, imgshards=run(1, one)), BenchPoint(workers=2, imgshards=run(2, two))]
        )
        reports.append(report)
    return WorkerRounds.of(reports)


def test_the_verdict_tells_the_median_the_chart_shows():
    rounds = rounds_of_the_trial()
    assert sorted(rounds) == [1, 2]
    assert rounds[1].images_per_s == pytest.approx(311) and rounds[2].images_per_s == pytest.approx(279)
    assert rounds[2].spread == (pytest.approx(250), pytest.approx(440))
    assert rounds[2].combined.images_per_s == pytest.approx(323)  # the rounds added up: not what is told
    verdicts = {w: r.verdict(step_seconds=STEP, batch_size=BATCH) for w, r in rounds.items()}
    assert verdicts[2].bound == "loader" and verdicts[2].wait_share == pytest.approx(0.5)
    assert verdicts[2].delivered_images_per_s == pytest.approx(279)
    assert verdicts[2].factor == pytest.approx(MODEL / 279)
    assert "the loader delivers 279 " in str(verdicts[2])
    best = max(rounds, key=lambda w: verdicts[w].delivered_images_per_s)  # as the notebook picks it
    assert best == 1 and max(rounds, key=lambda w: rounds[w].images_per_s) == best  # the chart's tallest


def test_the_notebook_reads_every_rate_from_the_helper():
    loader = Path(__file__).resolve().parents[2] / "notebooks" / "loader.ipynb"
    source = "\n".join(c.source for c in nbformat.read(loader, as_version=4).cells if c.cell_type == "code")
    assert "rounds = WorkerRounds.of(reports)" in source
    assert "median_rate = {w: rounds[w].images_per_s for w in WORKERS}" in source
    assert "rounds[w].verdict(" in source
    for computed_again in ("statistics.median", "Verdict.of(", "RunResult.combine("):
        assert computed_again not in source, f"the notebook computes a rate itself: {computed_again}"
