"""``decode_on="cuda"`` on a real GPU: these skip where torch sees none; their first GPU run is the proof.

Written without a GPU at hand (see docs/gpu.md): everything they rely on was exercised on the
CPU (``test_device_defects.py``, ``test_augment.py``), and these hold the real CUDA parts (nvjpeg,
the streams and events, the caching allocator) to the same promises, on ImageNet-sized images:

- a full epoch per preset, with 0 and 2 workers, pinning on and off: the workers' samples and labels;
- the race: ``torch.cuda._sleep`` on the work stream and a small decode bound, bit for bit the
  images of a run that synchronizes after every decode call;
- odd files: the workers' keys and labels, fallbacks counted; an out-of-memory error propagates;
- determinism, mid-epoch resume; memory within the bound, the reserve flat across epochs;
- overlap: host time per ``next()`` far below a ``_sleep`` step; ``cuda:1``, ``"cuda"`` after ``set_device``.
"""

from __future__ import annotations

import io
import json
import random
import time
from itertools import islice

import numpy as np
import pytest
import torch
from PIL import Image

from imgshards.loader import DecodeOn, ShardDataset, make_loader, to_device
from imgshards.loader.device.backends import default_backend
from imgshards.loader.device.streams import CudaOrdering

CUDA = torch.cuda.is_available()
pytestmark = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
needs_two = pytest.mark.skipif(not CUDA or torch.cuda.device_count() < 2, reason="needs two CUDA devices")

# The batched augment against the workers' per-image presets (tests/loader/device/test_augment.py),
# plus nvjpeg's IDCT against libjpeg-turbo's: in uint8 levels.
MEAN_TOLERANCE, P99_TOLERANCE = 2.5, 10


@pytest.fixture(scope="module")
def packed_imagenet(tree_factory, packed_factory):
    """ImageNet-sized JPEGs (500x375), 3 classes x 30."""
    return packed_factory(
        tree_factory(classes=3, per_class=30, profile="imagenet", seed=5), shard_size=2_000_000
    )


@pytest.fixture(scope="module")
def packed_large(tmp_path_factory, packed_factory):
    """Large JPEGs (up to 3000x2000), to hold the memory bound where it matters."""
    root = tmp_path_factory.mktemp("large") / "src"
    rng = random.Random(0)
    for cls in range(2):
        folder = root / f"n{cls:08d}"
        folder.mkdir(parents=True)
        for i in range(12):
            size = (rng.choice([3000, 2400, 1600]), rng.choice([2000, 1800, 1200]))
            im = Image.frombytes("RGB", (8, 6), rng.randbytes(144)).resize(size, Image.BICUBIC)
            im.save(folder / f"n{cls:08d}_{i}.JPEG", quality=85)
    return packed_factory(root, shard_size=20_000_000)


def _jpeg(image: Image.Image, **kw) -> bytes:
    buf = io.BytesIO()
    image.save(buf, "JPEG", **kw)
    return buf.getvalue()


@pytest.fixture(scope="module")
def packed_odd_large(tree_factory, packed_factory):
    """ImageNet-sized files with a cut JPEG (header intact), a PNG, a CMYK and a progressive JPEG."""
    src = tree_factory(classes=2, per_class=10, profile="imagenet", seed=11)
    files = sorted(src.rglob("*.JPEG"))
    data = files[3].read_bytes()
    files[3].write_bytes(data[: len(data) * 3 // 4])
    with Image.open(files[5]) as im:
        rgb = im.convert("RGB")
    files[6].write_bytes(_jpeg(rgb.convert("CMYK")))
    files[7].write_bytes(_jpeg(rgb, progressive=True))
    rgb.save(files[8].with_suffix(".png"))
    files[8].unlink()
    return packed_factory(src, shard_size=2_000_000, check="none", keep_formats=True)


def worker_batches(root, num_workers=2, **kw):
    return [to_device(b, "cpu") for b in make_loader(ShardDataset(root, **kw), num_workers=num_workers)]


def assert_close_to_workers(got, expected):
    assert len(got) == len(expected)
    for x, y in zip(got, expected, strict=True):
        assert x.images.is_cuda and x.labels.is_cuda
        assert torch.equal(x.labels.cpu(), y.labels)
        diff = (x.images.float().cpu() - y.images).abs() * 0.229 * 255  # back to uint8 levels
        assert diff.mean() < MEAN_TOLERANCE and diff.flatten().quantile(0.99) <= P99_TOLERANCE


@pytest.mark.parametrize("transform", ["train", "resnet", "eval"])
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("pin_memory", [False, True])
def test_a_full_epoch_gives_the_workers_samples(packed_imagenet, transform, num_workers, pin_memory):
    mode = "eval" if transform == "eval" else "train"
    kw = dict(batch_size=16, transform=transform, mode=mode, seed=3)
    expected = worker_batches(packed_imagenet, num_workers=num_workers, **kw)  # the same worker plan
    ds = ShardDataset(packed_imagenet, decode_on="cuda", **kw)
    loader = make_loader(ds, num_workers=num_workers, pin_memory=pin_memory)
    got = [b for b in loader]
    torch.cuda.synchronize()
    assert len(got) == len(loader)
    assert_close_to_workers(got, expected)


class SleepyOrdering(CudaOrdering):
    """The work stream held back after every decode call: freed blocks stay pending a long time."""

    def decoded(self, images):
        super().decoded(images)
        with torch.cuda.stream(self.work_stream):
            torch.cuda._sleep(20_000_000)  # ~10 ms of GPU time


class SyncingOrdering(CudaOrdering):
    """Everything finished after every decode call: no race is possible."""

    def decoded(self, images):
        super().decoded(images)
        torch.cuda.synchronize()


def test_race_stress_is_bit_exact_with_a_synchronized_run(packed_imagenet):
    config = DecodeOn(device="cuda", max_decoded_bytes=3 * 500 * 375 * 3, ahead=2)

    def run(ordering):
        ds = ShardDataset(packed_imagenet, batch_size=16, transform="resnet", decode_on=config, seed=1)
        loader = make_loader(ds, num_workers=2)
        loader.decoder._ordering = ordering
        out = []
        for batch in loader:
            torch.cuda._sleep(5_000_000)  # a step on the training stream
            out.append(batch.images.cpu())
        return out

    stressed, synced = run(SleepyOrdering), run(SyncingOrdering)
    assert len(stressed) == len(synced)
    for a, b in zip(stressed, synced, strict=True):
        assert torch.equal(a, b)


def test_odd_files_keep_the_workers_keys_and_labels(packed_odd_large):
    kw = dict(batch_size=4, mode="eval", transform="eval")
    with pytest.warns(RuntimeWarning, match="skipped"):
        expected = worker_batches(packed_odd_large, **kw)
        ds = ShardDataset(packed_odd_large, decode_on="cuda", **kw)
        loader = make_loader(ds, num_workers=2)
        got = list(loader)
    assert_close_to_workers(got, expected)
    assert ds.corrupt_skipped == 1
    assert loader.decoder.stats.fallbacks == {"not a JPEG": 1, "CMYK": 1, "progressive": 1, "truncated": 1}


def test_out_of_memory_propagates(packed_imagenet):
    real = default_backend(torch.device("cuda"))
    calls = []

    def greedy(datas, device):
        calls.append(len(datas))
        torch.empty(1 << 50, dtype=torch.uint8, device=device)  # a petabyte: a real OutOfMemoryError
        return real(datas, device)

    ds = ShardDataset(packed_imagenet, batch_size=16, decode_on="cuda")
    loader = make_loader(ds, num_workers=2)
    loader.decoder.backend = greedy
    with pytest.raises(torch.OutOfMemoryError):
        list(loader)
    assert len(calls) == 1  # no retry, no halving


def test_determinism_and_mid_epoch_resume(packed_imagenet):
    def loader():
        ds = ShardDataset(packed_imagenet, batch_size=16, transform="train", decode_on="cuda", seed=9)
        return make_loader(ds, num_workers=2)

    full = [b.images.cpu() for b in loader()]
    again = [b.images.cpu() for b in loader()]
    assert all(torch.equal(a, b) for a, b in zip(full, again, strict=True))
    first = loader()
    head = [b.images.cpu() for b in islice(first, 2)]
    state = json.loads(json.dumps(first.state_dict()))
    second = loader()
    second.load_state_dict(state)
    rest = [b.images.cpu() for b in second]
    assert len(head + rest) == len(full)
    assert all(torch.equal(a, b) for a, b in zip(head + rest, full, strict=True))


def test_memory_stays_within_the_bound_and_the_reserve_is_flat(packed_large):
    config = DecodeOn(device="cuda", max_decoded_bytes=64 << 20)
    ds = ShardDataset(packed_large, batch_size=8, transform="resnet", decode_on=config)
    loader = make_loader(ds, num_workers=2)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    reserved = []
    for _ in range(3):
        for batch in loader:
            del batch
        torch.cuda.synchronize()
        reserved.append(torch.cuda.memory_reserved())
    stats = loader.decoder.settle()
    assert torch.cuda.max_memory_allocated() - base <= stats.bound_bytes
    assert stats.peak_bytes <= stats.bound_bytes
    # Flat: the third epoch reuses what the second reserved (5% for the shuffle's other order of sizes).
    assert reserved[2] <= reserved[1] * 1.05, f"the reserve grew across epochs: {reserved}"


def test_next_costs_the_host_far_less_than_the_step(packed_imagenet):
    ds = ShardDataset(packed_imagenet, batch_size=8, transform="train", decode_on="cuda")
    loader = make_loader(ds, num_workers=2)
    assert len(loader) >= 6
    it = iter(loader)
    batch = next(it)
    host = []
    for _ in range(4):
        torch.cuda._sleep(200_000_000)  # a step of ~100 ms on the training stream
        batch.images.sum().item()  # the step's end, as a loss.item() would
        time.sleep(0.05)
        start = time.perf_counter()
        batch = next(it)
        host.append(time.perf_counter() - start)
    it.close()
    assert float(np.median(host)) < 0.01, f"next() took {[round(h * 1000, 1) for h in host]} ms"


@needs_two
def test_a_second_device(packed_imagenet):
    ds = ShardDataset(packed_imagenet, batch_size=16, transform="eval", mode="eval", decode_on="cuda:1")
    got = list(make_loader(ds, num_workers=2))
    assert all(b.images.device == torch.device("cuda", 1) for b in got)
    assert_close_to_workers(
        got, worker_batches(packed_imagenet, batch_size=16, transform="eval", mode="eval")
    )


@needs_two
def test_cuda_means_the_current_device_after_set_device(packed_imagenet):
    previous = torch.cuda.current_device()
    torch.cuda.set_device(1)
    try:
        ds = ShardDataset(packed_imagenet, batch_size=16, decode_on="cuda")
        batch = next(iter(make_loader(ds, num_workers=0)))
        assert batch.images.device == torch.device("cuda", 1)
    finally:
        torch.cuda.set_device(previous)
