"""What ``imgshards bench`` measures: :class:`BenchConfig`, checked when it is made."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import ConfigError
from ..image.presets import PRESETS
from .devicerun import DECODE_ON

__all__ = ["BenchConfig"]


@dataclass(frozen=True, kw_only=True)
class BenchConfig:
    """What to measure. Every value is checked when the config is made.

    Args:
        split: Split of the packed dataset to read.
        preset: Augmentation preset (one of :data:`~imgshards.loader.PRESETS`), for both pipelines.
        batch_size: Images per batch.
        workers: DataLoader worker counts, one run each (several: a sweep). ``0``: in the main process.
        prefetch_factor: Batches each worker may prepare ahead.
        seconds: Time each run from its first batch for this long (``None``: no time bound).
        batches: Time each run over this many batches after its first (``None``: no count bound);
            with both bounds a run stops at the first reached.
        model_ms: Simulate a training step of this many milliseconds per batch.
        model_images_per_s: Or simulate a model taking this many images a second.
        cold: Drop the files read from the page cache before each run.
        seed: Seed of the shuffles and augmentation.
        progress: Show a progress bar (images/s) on stderr.
        decode_on: ``"workers"`` (decode and augment in the DataLoader workers), or ``"cpu"`` /
            ``"cuda"``: the workers only read, the training process decodes (``ShardDataset(decode_on=)``).

    Raises:
        ConfigError: a value out of range or not among the allowed ones.

    """

    split: str = "train"
    preset: str = "train"
    batch_size: int = 64
    workers: tuple[int, ...] = (2,)
    prefetch_factor: int = 2
    seconds: float | None = 20.0
    batches: int | None = None
    model_ms: float | None = None
    model_images_per_s: float | None = None
    cold: bool = False
    seed: int = 0
    progress: bool = False
    decode_on: str = "workers"

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise ConfigError(f"unknown preset {self.preset!r}; expected one of {list(PRESETS)}")
        if self.decode_on not in DECODE_ON:
            raise ConfigError(f"unknown decode_on {self.decode_on!r}; expected one of {list(DECODE_ON)}")
        if self.decode_on == "cuda" and not torch.cuda.is_available():
            raise ConfigError("decode_on 'cuda' needs a CUDA device, and torch sees none; try 'cpu'")
        if self.batch_size < 1:
            raise ConfigError(f"batch_size must be at least 1, got {self.batch_size}")
        if not self.workers or any(w < 0 for w in self.workers):
            raise ConfigError(f"workers must be one or more counts >= 0, got {list(self.workers)}")
        if len(set(self.workers)) != len(self.workers):
            raise ConfigError(f"each worker count once, got {list(self.workers)}")
        if self.prefetch_factor < 1:
            raise ConfigError(f"prefetch_factor must be at least 1, got {self.prefetch_factor}")
        if self.seconds is None and self.batches is None:
            raise ConfigError("a run needs a bound: seconds, batches, or both")
        if self.seconds is not None and not self.seconds > 0:
            raise ConfigError(f"seconds must be > 0, got {self.seconds}")
        if self.batches is not None and self.batches < 1:
            raise ConfigError(f"batches must be at least 1, got {self.batches}")
        if self.model_ms is not None and self.model_images_per_s is not None:
            raise ConfigError("give the model's cost as model_ms or as model_images_per_s, not both")
        for name in ("model_ms", "model_images_per_s"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ConfigError(f"{name} must be > 0, got {value}")

    @property
    def step_seconds(self) -> float:
        """Seconds of the simulated training step per batch (0: no model)."""
        if self.model_ms is not None:
            return self.model_ms / 1000
        if self.model_images_per_s is not None:
            return self.batch_size / self.model_images_per_s
        return 0.0
