"""A stand-in for ``torchvision.datasets``, with ``ImageFolder`` over packed shards: a one-line switch.

A script that imports the module, as pytorch/examples' ``imagenet/main.py`` does, switches by that
line alone::

    import imgshards.loader.torchvision_datasets as datasets  # was: import torchvision.datasets as datasets

``datasets.ImageFolder`` is imgshards' (:class:`~imgshards.loader.ImageFolder`, a packed split);
every other name is torchvision's own, looked up in ``torchvision.datasets`` when first used:
``datasets.FakeData`` (main.py's ``--dummy``), ``CIFAR10``, ``VisionDataset``... ``DatasetFolder``
is torchvision's too: imgshards has no ``DatasetFolder``, and torchvision's lists a tree of files
(give it the tree, not the shards). ``import imgshards.loader as datasets`` offers ``ImageFolder``
alone: it is the loader's API, not torchvision's module (issue 50).
"""

from __future__ import annotations

from typing import Any

import torchvision.datasets as _torchvision

from .imagefolder import ImageFolder

__all__ = ["ImageFolder", *sorted(set(_torchvision.__all__) - {"ImageFolder"})]


def __getattr__(name: str) -> Any:
    # Called only for a name this module does not define: torchvision's, or its AttributeError
    # (which names torchvision.datasets, where the name is missing).
    return getattr(_torchvision, name)


def __dir__() -> list[str]:
    return sorted({*globals(), *dir(_torchvision)})
