"""Measuring a loader the way a training loop sees it: the library side of ``imgshards bench``.

- ``steps`` (:mod:`imgshards.loader.pipeline.steps`, part of the data path, which
  imports nothing from this package): the clock each worker times its steps with, published in
  shared memory; this package reads it.
- :mod:`.procstats`: peak and proportional memory of processes, page-cache eviction.
- :mod:`.config`: :class:`~.config.BenchConfig`, what a benchmark measures.
- :mod:`.runner`: :func:`~.runner.bench`, the runs themselves (imgshards and an ImageFolder baseline).
- :mod:`.report`: what a run measured, the verdict (loader- or compute-bound) and the sweep plot.

This ``__init__`` imports nothing up front (its names load on first use): the runner imports the
data path, and ``import imgshards.loader.profiling`` alone should not.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..pipeline import steps
    from .config import BenchConfig
    from .runner import bench

__all__ = ["BenchConfig", "bench", "steps"]


def __getattr__(name: str) -> Any:
    # `from imgshards.loader.profiling import BenchConfig, bench` loads the runner on first use only.
    if name == "bench":
        from .runner import bench

        return bench
    if name == "steps":
        from ..pipeline import steps

        return steps
    if name == "BenchConfig":
        from .config import BenchConfig

        return BenchConfig
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
