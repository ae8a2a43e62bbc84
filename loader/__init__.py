"""Stream packed shards into PyTorch training: shuffled, decoded, augmented and batched in the workers.

from imgshards.loader import ShardDataset, make_loader, to_device

dataset = ShardDataset("/data/imagenet-shards", split="train", batch_size=256)
loader = make_loader(dataset, num_workers=8)
for batch in loader:
    images, labels = to_device(batch, "cuda")

# Coming from torchvision: the same map-style dataset, over the packed split (any sampler, transform):
dataset = ImageFolder("/data/imagenet-shards/train", transform)  # was ImageFolder("/data/imagenet/train")

# Or decode and augment on the GPU (nvjpeg); the workers only read and shuffle:
dataset = ShardDataset("/data/imagenet-shards", split="train", batch_size=256, decode_on="cuda")
"""

from imgshards.converter.format.errors import ImgshardsError, ManifestError

from . import stages
from .dataloader import ShardLoader, make_loader
from .dataset import ShardDataset
from .errors import (
    ConfigError,
    CorruptImageError,
    DatasetNotFoundError,
    ImageShapeError,
    LoaderTimeoutError,
    ResourceLimitError,
    ResumeError,
    SettingFixedError,
    ShardAccessError,
    ShardReadError,
    WorkerError,
)
from .image.decode import decode as decode_image
from .image.presets import (
    PRESETS,
    PresetName,
    RandomResizedCropFlip,
    ResizeCenterCrop,
    ScaleCropFlipColor,
    preset,
)
from .imagefolder import ImageFolder
from .mix import MixedDataset
from .pipeline.collate import IMAGENET_MEAN, IMAGENET_STD, to_device
from .pipeline.offload import DecodeOn
from .pipeline.settings import Mode, OnError, Settings
from .remote import RetryPolicy, ShardSource
from .state.buffers import Batch

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "PRESETS",
    "Batch",
    "ConfigError",
    "CorruptImageError",
    "DatasetNotFoundError",
    "DecodeOn",
    "ImageFolder",
    "ImageShapeError",
    "ImgshardsError",
    "LoaderTimeoutError",
    "ManifestError",
    "MixedDataset",
    "Mode",
    "OnError",
    "PresetName",
    "RandomResizedCropFlip",
    "ResizeCenterCrop",
    "ResourceLimitError",
    "ResumeError",
    "RetryPolicy",
    "ScaleCropFlipColor",
    "SettingFixedError",
    "Settings",
    "ShardAccessError",
    "ShardDataset",
    "ShardLoader",
    "ShardReadError",
    "ShardSource",
    "WorkerError",
    "decode_image",
    "make_loader",
    "preset",
    "stages",
    "to_device",
]
