"""``ImageFolder``: torchvision's ImageFolder over a packed split, held to torchvision's on the source tree.

Every dataset here is packed by the real ``pack`` from a tree of real JPEGs, which it stores as they
are: the same bytes, so the same pixels as torchvision's ``ImageFolder`` decodes from the tree.
"""

from __future__ import annotations

import base64
import collections
import contextlib
import hashlib
import io
import json
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader, DistributedSampler, Subset, random_split
from torchvision import datasets
from torchvision.transforms import v2

from imgshards.converter.format.errors import ManifestError
from imgshards.converter.format.manifest import INDEX_NAME, read_manifest
from imgshards.converter.format.tables import BLOCK
from imgshards.loader import ConfigError, CorruptImageError, ImageFolder
from imgshards.loader.image.decode import decode, pil_image


def image_hash(image: Image.Image | torch.Tensor) -> str:
    """The pixels' hash, of a PIL image or a ``[3, H, W]`` tensor of it alike."""
    array = image.permute(1, 2, 0).numpy() if isinstance(image, torch.Tensor) else np.asarray(image)
    return hashlib.sha1(np.ascontiguousarray(array).tobytes()).hexdigest()


def pairs(dataset) -> collections.Counter[tuple[str, int]]:
    """The multiset of (pixel hash, label) of a map-style dataset, read in the main process."""
    return collections.Counter((image_hash(img), int(label)) for img, label in dataset)


def loaded_pairs(loader: DataLoader) -> list[tuple[str, int]]:
    """(pixel hash, label) of every sample a DataLoader over uint8 tensors yields."""
    out = []
    for images, labels in loader:
        out += [(image_hash(img), int(label)) for img, label in zip(images, labels, strict=True)]
    return out


@pytest.fixture(scope="module")
def n(loader_tree) -> int:
    """Samples in the tree (and in each packed split of it)."""
    return sum(1 for p in loader_tree.rglob("*") if p.is_file())


@pytest.fixture(scope="module")
def torchvision_pairs(loader_tree) -> collections.Counter[tuple[str, int]]:
    return pairs(datasets.ImageFolder(str(loader_tree)))


def test_every_image_label_and_attribute_is_torchvisions(n, loader_tree, packed_many, torchvision_pairs):
    ours, theirs = ImageFolder(packed_many), datasets.ImageFolder(str(loader_tree))
    assert len(ours) == len(theirs) == n
    assert ours.classes == theirs.classes and ours.class_to_idx == theirs.class_to_idx
    assert sorted(ours.targets) == sorted(theirs.targets)
    images = [ours[i] for i in range(len(ours))]
    assert all(img.mode == "RGB" for img, _ in images)
    assert ours.targets == [label for _, label in images]  # targets[i] is ds[i]'s label
    assert pairs(images) == torchvision_pairs  # the same pixels and labels, every image once
    assert image_hash(ours[-1][0]) == image_hash(images[-1][0])  # negative indexes, as a list's
    with pytest.raises(IndexError):
        ours[len(ours)]
    assert sum(1 for _ in ours) == n  # the sequence protocol stops at the end


def test_a_torchvision_script_with_one_line_changed_runs_as_a_file(n, tmp_path, loader_tree, packed_many):
    script = textwrap.dedent(
        """
        import collections, json, sys

        import torch
        from torch.utils.data import DataLoader
        from torchvision import transforms
        from torchvision.datasets import ImageFolder

        trans = transforms.Compose([
            transforms.RandomResizedCrop(32),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
        ])
        dataset = ImageFolder(sys.argv[1], trans)
        loader = DataLoader(dataset, batch_size=16, shuffle=True, num_workers=2)
        epochs = []
        for epoch in range(2):
            counts = collections.Counter()
            for images, labels in loader:
                assert images.shape[1:] == (3, 32, 32) and images.dtype == torch.float32
                counts.update(labels.tolist())
            epochs.append(sorted(counts.items()))
        print(json.dumps({"classes": dataset.classes, "epochs": epochs, "batches": len(loader)}))
        """
    )
    original = tmp_path / "train_torchvision.py"
    original.write_text(script)
    changed = tmp_path / "train_shards.py"
    line = "from torchvision.datasets import ImageFolder"
    changed.write_text(script.replace(line, "from imgshards.loader import ImageFolder"))
    assert (
        sum(a != b for a, b in zip(script.splitlines(), changed.read_text().splitlines(), strict=True)) == 1
    )
    results = []
    for path, root in [(original, loader_tree), (changed, packed_many)]:
        done = subprocess.run(
            [sys.executable, path.name, str(root)], cwd=tmp_path, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr[-3000:]
        results.append(json.loads(done.stdout))
    assert results[0] == results[1]  # every sample once an epoch: each class's count, both epochs
    assert sum(n for _, n in results[1]["epochs"][0]) == n


def test_a_shuffled_epoch_through_forked_workers_is_every_sample_once(packed_many, torchvision_pairs):
    dataset = ImageFolder(packed_many, v2.PILToTensor())
    dataset[0]  # a shard opened before the workers fork: each worker opens its own
    loader = DataLoader(dataset, batch_size=16, shuffle=True, num_workers=2)
    for _ in range(2):
        assert collections.Counter(loaded_pairs(loader)) == torchvision_pairs


def test_spawned_workers_get_a_dataset_without_open_files(packed_many, torchvision_pairs):
    dataset = ImageFolder(packed_many, v2.PILToTensor())
    dataset[0]
    assert dataset.reader._held  # one shard open here, and the pickle carries none
    assert not pickle.loads(pickle.dumps(dataset)).reader._held
    loader = DataLoader(dataset, batch_size=16, num_workers=2, multiprocessing_context="spawn")
    assert collections.Counter(loaded_pairs(loader)) == torchvision_pairs


def test_v2_transforms_and_a_target_transform(packed_many):
    trans = v2.Compose(
        [
            v2.PILToTensor(),
            v2.RandomResizedCrop(24, antialias=True),
            v2.RandomHorizontalFlip(),
            v2.ToDtype(torch.float32, scale=True),
        ]
    )
    dataset = ImageFolder(packed_many, trans, target_transform=lambda t: t + 100)
    loader = DataLoader(dataset, batch_size=8, shuffle=True, num_workers=2)
    labels = []
    for images, batch_labels in loader:
        assert images.shape[1:] == (3, 24, 24) and images.dtype == torch.float32
        assert images.min() >= 0.0 and images.max() <= 1.0
        labels += batch_labels.tolist()
    assert sorted(labels) == sorted(t + 100 for t in dataset.targets)


def test_subset_and_random_split(n, packed_many, torchvision_pairs):
    dataset = ImageFolder(packed_many, v2.PILToTensor())
    train, val = random_split(dataset, [0.8, 0.2], generator=torch.Generator().manual_seed(0))
    assert len(train) + len(val) == n and not set(train.indices) & set(val.indices)
    got = loaded_pairs(DataLoader(train, batch_size=16, shuffle=True, num_workers=2))
    got += loaded_pairs(DataLoader(val, batch_size=16, num_workers=2))
    assert collections.Counter(got) == torchvision_pairs
    odd = Subset(dataset, range(1, n, 2))
    assert [odd[k][1] for k in range(len(odd))] == dataset.targets[1::2]


def test_distributed_sampler_gives_each_rank_its_part(n, packed_many, torchvision_pairs):
    dataset = ImageFolder(packed_many, v2.PILToTensor())
    got = []
    for rank in range(2):
        sampler: DistributedSampler = DistributedSampler(
            dataset, num_replicas=2, rank=rank, shuffle=True, seed=0
        )
        sampler.set_epoch(3)
        got.append(loaded_pairs(DataLoader(dataset, batch_size=8, sampler=sampler, num_workers=2)))
    assert len(got[0]) == len(got[1]) == (n + 1) // 2
    # 115 samples on 2 ranks: DistributedSampler repeats one sample to even them out.
    assert set(got[0] + got[1]) == set(torchvision_pairs)
    assert sum((collections.Counter(got[0] + got[1]) - torchvision_pairs).values()) == 1


def _shard_fds(root: Path) -> int:
    """The file descriptors of this process open on shards under ``root`` (not its mapped tables)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the descriptor listdir itself held, closed by now
            target = os.readlink(f"/proc/self/fd/{fd}")
            count += target.startswith(str(root.resolve())) and target.endswith(".tar")
    return count


def test_each_worker_keeps_at_most_max_open_shards_open(n, packed_many):
    shards = len(read_manifest(packed_many).split("train").shards)
    dataset = ImageFolder(
        packed_many, v2.PILToTensor(), target_transform=lambda t: _shard_fds(packed_many), max_open=2
    )
    for i in range(len(dataset)):  # the training process opens shards too, before the fork
        assert dataset[i][1] <= 2
    assert _shard_fds(packed_many) == 2
    loader = DataLoader(dataset, batch_size=8, shuffle=True, num_workers=2)
    seen = [n for _, counts in loader for n in counts.tolist()]
    assert len(seen) == n and max(seen) <= 2 < shards


def test_a_url_root_fails_in_one_line_naming_shard_dataset():
    with pytest.raises(ConfigError, match="ShardDataset") as caught:
        ImageFolder("https://example.com/shards")
    assert "\n" not in str(caught.value)


def test_the_index_file_or_a_split_name(n, packed_many, mixed_packed):
    assert len(ImageFolder(packed_many / INDEX_NAME)) == n
    val = ImageFolder(mixed_packed, split="val")
    assert len(val) == read_manifest(mixed_packed).split("val").samples == len(val.targets)
    with pytest.raises(ManifestError, match="no split 'test'"):
        ImageFolder(mixed_packed, split="test")


# ---- untrusted input: a hostile index, a damaged shard ---------------------------------------------


def _starts(root: Path) -> tuple[list[int], list[int]]:
    """The split's table of starts (in 512-byte blocks), and where each shard's entries begin in it."""
    info = read_manifest(root).split("train")
    first = np.cumsum([0, *(s.samples for s in info.shards)]).tolist()
    return read_entries(root)["starts"].tolist(), first


def read_entries(root: Path) -> dict[str, np.ndarray]:
    return {
        t: np.fromfile(root / f.name, dtype="<u4")
        for t, f in read_manifest(root).split("train").tables.items()
        if t != "sources"
    }


def test_an_offset_past_the_shards_end_fails_cleanly(packed_copy, index_rewriter):
    starts, first = _starts(packed_copy)
    bytes0 = read_manifest(packed_copy).split("train").shards[0].bytes
    last = first[1] - 1
    starts[last] = bytes0 // BLOCK + 100  # the index claims a larger shard, its last sample past the end

    def grow(split):
        split["shards"][0]["bytes"] += 200 * BLOCK
        split["bytes"] += 200 * BLOCK

    index_rewriter(packed_copy, tables={"starts": starts}, edit=grow)
    with pytest.warns(RuntimeWarning, match="the index says"):
        dataset = ImageFolder(packed_copy)
    with pytest.raises(
        CorruptImageError, match=r"sample \d+ of split 'train' .*train-000000\.tar.* cut short"
    ):
        dataset[last]
    dataset[0]  # the other samples still read


def test_a_shard_the_index_says_holds_half_a_terabyte_is_read_no_further_than_its_end(
    packed_copy, index_rewriter
):
    tables = read_entries(packed_copy)
    first = _starts(packed_copy)[1]
    at = first[1]  # one more sample in shard 0, 256 GiB in; one entry each in the labels and keys
    tables = {
        "starts": np.insert(tables["starts"], at, 2**29),
        "labels": np.insert(tables["labels"], at, 0),
        "keys": np.insert(tables["keys"], at, 0),
    }

    def huge(split):  # a hostile index: pread would allocate the declared span before reading
        shard = split["shards"][0]
        shard["samples"] += 1
        split["samples"] += 1
        split["class_counts"][0] += 1
        shard["bytes"] += 2**39
        split["bytes"] += 2**39

    index_rewriter(packed_copy, tables=tables, drop=["sources"], edit=huge)
    with pytest.warns(RuntimeWarning, match="the index says"):
        dataset = ImageFolder(packed_copy)
    last = at
    with pytest.raises(CorruptImageError, match="cut short"):
        dataset[last]
    image, _ = dataset[last - 1]  # its span, to the next start, is read to the file's end: whole
    assert image.size == (64, 48)


def test_an_offset_inside_a_member_fails_cleanly(packed_copy, index_rewriter):
    starts, _ = _starts(packed_copy)
    starts[1] += 1  # sample 1 said to start one block after its header: inside its image
    index_rewriter(packed_copy, tables={"starts": starts})
    with pytest.raises(
        CorruptImageError, match="does not parse as a tar sample: a tar header has a bad checksum"
    ):
        ImageFolder(packed_copy)[1]


def test_a_table_the_index_check_refuses_fails_at_build(packed_copy, index_rewriter, format1, tmp_path):
    old = format1(packed_copy, tmp_path / "v1")  # format 1: one entry more than the shard has samples
    doc = json.loads((old / INDEX_NAME).read_text())
    shard = doc["splits"]["train"]["shards"][0]
    shard["offsets"] = base64.b64encode(bytes(4) * (shard["samples"] + 1)).decode()
    (old / INDEX_NAME).write_text(json.dumps(doc))
    with pytest.raises(ManifestError, match="offsets"):
        ImageFolder(old)

    def one_too_many(split):  # format 2: the index names a table of another size than its samples need
        split["tables"]["starts"]["bytes"] += 4

    index_rewriter(packed_copy, edit=one_too_many)
    with pytest.raises(ManifestError, match=r"tables\.starts\.bytes"):
        ImageFolder(packed_copy)


def test_a_table_file_not_what_the_index_says_fails_the_first_read_naming_it(packed_copy):
    info = read_manifest(packed_copy).split("train")
    starts = packed_copy / info.tables["starts"].name
    starts.write_bytes(starts.read_bytes() + bytes(4))  # one entry more than the index says
    dataset = ImageFolder(packed_copy)
    with pytest.raises(ManifestError, match=rf"{starts.name} is .* bytes where the index says"):
        dataset[0]
    starts.unlink()  # gone, as a re-pack removes the tables it replaces
    with pytest.raises(ManifestError, match=rf"{starts.name} is missing: .*re-packed"):
        ImageFolder(packed_copy)[0]


def test_a_truncated_shard_names_the_sample(packed_copy):
    shard = packed_copy / "train-000000.tar"
    shard.write_bytes(shard.read_bytes()[: 3 * BLOCK])
    with pytest.warns(RuntimeWarning, match="truncated or replaced"):
        dataset = ImageFolder(packed_copy)
    with pytest.raises(CorruptImageError, match=r"shard train-000000\.tar.*cut short.*imgshards verify"):
        dataset[0]


def test_an_image_that_does_not_decode_names_its_source_path(packed_corrupt):
    dataset = ImageFolder(packed_corrupt)
    bad = []
    for i in range(len(dataset)):
        try:
            dataset[i]
        except CorruptImageError as e:
            bad.append(str(e))
    assert len(bad) == 1
    assert "does not decode" in bad[0] and "packed from 'n00000000/" in bad[0] and "\n" not in bad[0]


def test_shards_without_a_table_of_sample_starts_are_refused_in_one_line(class_sorted):
    with pytest.raises(ConfigError, match=r"no table of sample starts.*ShardDataset"):
        ImageFolder(class_sorted)


def test_a_shard_replaced_by_a_link_out_of_the_dataset_is_refused(packed_copy, tmp_path):
    outside = tmp_path / "outside.tar"
    shutil.move(packed_copy / "train-000000.tar", outside)
    (packed_copy / "train-000000.tar").symlink_to(outside)
    with pytest.raises(ManifestError, match="outside the dataset"):
        ImageFolder(packed_copy)


# ---- the image: ShardDataset's decode rules, in Pillow ----------------------------------------------


def _jpeg(size: tuple[int, int], orientation: int | None = None) -> bytes:
    im = Image.new("RGB", size)
    im.paste((200, 30, 30), (0, 0, size[0] // 2, size[1] // 3))  # a red block in one corner
    exif = Image.Exif()
    if orientation is not None:
        exif[0x0112] = orientation
    buf = io.BytesIO()
    im.save(buf, format="JPEG", quality=95, exif=exif.tobytes())
    return buf.getvalue()


def test_a_jpegs_exif_orientation_is_applied_as_the_tensor_decoder_applies_it():
    data = _jpeg((64, 48), orientation=6)  # stored landscape, shown turned a quarter: portrait
    image = pil_image(data, "jpg")
    tensor = decode(data, "jpg")
    assert image.size == (48, 64) and tuple(tensor.shape) == (3, 64, 48)
    diff = np.abs(np.asarray(image).astype(int) - tensor.permute(1, 2, 0).numpy().astype(int))
    assert diff.mean() < 3  # the same upright pixels (two libjpeg builds may round apart)


def test_an_image_declaring_too_many_pixels_is_refused_before_any_decode():
    data = bytearray(_jpeg((64, 48)))
    sof = data.index(b"\xff\xc0")  # the frame header: height and width at +5 and +7
    data[sof + 5 : sof + 9] = (60000).to_bytes(2, "big") + (60000).to_bytes(2, "big")
    with pytest.raises(ValueError, match="pixels"):
        pil_image(bytes(data), "jpg")
