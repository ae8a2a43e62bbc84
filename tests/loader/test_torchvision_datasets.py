"""``imgshards.loader.torchvision_datasets``: torchvision's datasets, ImageFolder ours (issue 50, point 16).

``import imgshards.loader as datasets``, the README's old one-line switch for pytorch/examples'
``imagenet/main.py``, broke its ``--dummy`` flag (``datasets.FakeData``: AttributeError). The stand-in
offers every name torchvision's module does; ``imgshards.loader`` itself stays the loader's API.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torchvision.datasets
from torchvision import transforms

import imgshards.loader
import imgshards.loader.torchvision_datasets as datasets


def test_every_name_of_torchvision_datasets_is_there_with_image_folder_ours():
    assert datasets.ImageFolder is imgshards.loader.ImageFolder
    assert datasets.FakeData is torchvision.datasets.FakeData
    assert datasets.DatasetFolder is torchvision.datasets.DatasetFolder  # torchvision's: imgshards has none
    for name in torchvision.datasets.__all__:
        if name != "ImageFolder":
            assert getattr(datasets, name) is getattr(torchvision.datasets, name), name
    assert set(datasets.__all__) == set(torchvision.datasets.__all__) | {"ImageFolder"}
    assert {"FakeData", "CIFAR10", "ImageFolder"} <= set(dir(datasets))
    with pytest.raises(AttributeError, match="NoSuchDataset"):
        datasets.NoSuchDataset  # noqa: B018


def test_main_py_dummy_flag_runs_on_the_stand_in():
    # pytorch/examples' imagenet/main.py, its --dummy branch as written there.
    train_dataset = datasets.FakeData(1281167, (3, 224, 224), 1000, transforms.ToTensor())
    image, target = train_dataset[0]
    assert tuple(image.shape) == (3, 224, 224) and 0 <= int(target) < 1000


def test_the_loader_api_is_unchanged_and_imports_no_more():
    assert "FakeData" not in imgshards.loader.__all__ and not hasattr(imgshards.loader, "FakeData")
    code = "import sys, imgshards.loader\nprint('imgshards.loader.torchvision_datasets' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
