"""Measuring a loader the way a training loop sees it: the library side of ``imgshards bench``.

- :mod:`.stagetimes`: the clock each worker times its stages with (read, decode, augment, collate),
  published in shared memory; the only module of this package the data path imports.
- :mod:`.procstats`: peak and proportional memory of processes, page-cache eviction.
- :mod:`.config`: :class:`~.config.BenchConfig`, what a benchmark measures.
- :mod:`.runner`: :func:`~.runner.bench`, the runs themselves (imgshards and an ImageFolder baseline).
- :mod:`.report`: what a run measured, the verdict (loader- or compute-bound) and the sweep plot.

This ``__init__`` imports nothing up front (its two names load on first use), so the data path's
use of :mod:`.stagetimes` never loads the benchmark runner (which itself imports the data path).
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .config import BenchConfig
    from .runner import bench

__all__ = ["BenchConfig", "bench"]


def __getattr__(name: str) -> Any:
    # `from imgshards.loader.profiling import BenchConfig, bench` loads the runner on first use only.
    if name == "bench":
        from .runner import bench

        return bench
    if name == "BenchConfig":
        from .config import BenchConfig

        return BenchConfig
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
