"""The nine defects of the GPU decode path (issue 23), each pinned by a test that runs on the CPU.

What needs a GPU to happen is brought about another way: ``meta`` tensors and the ``meta`` default
device for device mismatches, a fake batched decoder that raises the real exception types
(:class:`torch.OutOfMemoryError`, :class:`torch.AcceleratorError`) or decodes leniently as nvjpeg
does, and a recorder in place of the CUDA streams and events that logs the order of every call.
Each test fails on the code before the fix.
"""

from __future__ import annotations

import io
import statistics
import threading
import time
from itertools import islice

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils._python_dispatch import TorchDispatchMode

from imgshards.loader import ConfigError, DecodeOn, ShardDataset, make_loader, preset, to_device
from imgshards.loader.device.augment import canvas_bytes
from imgshards.loader.device.backends import default_backend, probe
from imgshards.loader.device.decoding import DeviceDecoder
from imgshards.loader.device.memory import LARGE_SEGMENT, SMALL_SEGMENT, bound, rounded
from imgshards.loader.image.decode import decode, jpeg_header
from imgshards.loader.pipeline.collate import collate
from imgshards.loader.pipeline.offload import raw_batch
from imgshards.loader.state.buffers import BufferPool, pool_token

# ---- helpers -------------------------------------------------------------------------------------


def _jpeg(image: Image.Image, **kw) -> bytes:
    buf = io.BytesIO()
    image.save(buf, "JPEG", **kw)
    return buf.getvalue()


def _photo(height: int, width: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 200 / width, y * 200 / height, (x + y) * 100 / (width + height)], axis=-1)
    return Image.fromarray((base + rng.integers(0, 40, base.shape)).clip(0, 255).astype(np.uint8))


def _raw(datas: list[bytes], *, index: int = 0, exts: list[str] | None = None):
    samples = [
        {"__key__": f"k{i}", (exts[i] if exts else "jpg"): d, "__label__": i % 3} for i, d in enumerate(datas)
    ]
    return raw_batch(samples, epoch=0, worker=0, index=index, shared=False)


def _decoder(config: DecodeOn, transform="train", size: int = 24, **kw) -> DeviceDecoder:
    return DeviceDecoder(
        config, transform=preset(transform, size=size), seed=3, rank=0, on_corrupt=None, **kw
    )


class CountingBackend:
    """The CPU backend, counting its calls; ``fail`` says what to raise for a call (or None)."""

    def __init__(self, fail=None) -> None:
        self.calls: list[int] = []
        self.fail = fail
        self.real = default_backend(torch.device("cpu"))

    def __call__(self, datas, device):
        self.calls.append(len(datas))
        if self.fail is not None and (error := self.fail(datas)) is not None:
            raise error
        return self.real(datas, device)


@pytest.fixture(scope="module")
def jpegs() -> list[bytes]:
    return [_jpeg(_photo(40 + 4 * i, 56 - 2 * i, i)) for i in range(12)]


# ---- 1: pool_token on decoded (device) batches ---------------------------------------------------


def test_1_pool_token_reads_the_trailer_on_the_cpu_whatever_the_default_device():
    pool = BufferPool(torch.zeros(2, dtype=torch.int64), first_token=0)
    image = torch.zeros(3, 4, 4, dtype=torch.uint8)
    batch = collate([image] * 2, [0, 1], pool=pool)
    torch.set_default_device("meta")
    try:
        # Before: the trailer view was made on the default device and set_ onto a CPU storage:
        # "Attempted to set the storage of a tensor on device meta to a storage on different device".
        assert pool_token(batch.images) == 0
        made = collate([image], [0])
        assert made.images.device.type == "cpu" and made.labels.device.type == "cpu"
    finally:
        torch.set_default_device(None)
    assert pool_token(batch.images.to("meta")) is None  # no device tensor is a worker buffer


# ---- 2: the stream race: ordering of decode, work and hand-over ----------------------------------


class Recorder:
    """Stands for :class:`~imgshards.loader.device.streams.CudaOrdering`: logs each call, in order."""

    def __init__(self, device) -> None:
        self.log: list[tuple] = []
        self.threads: list[int] = []  # the thread that logged each entry
        self.lock = threading.Lock()
        self.in_decode = False

    def _add(self, *entry) -> None:
        with self.lock:
            self.log.append(entry)
            self.threads.append(threading.get_ident())

    class _Scope:
        def __init__(self, rec, name) -> None:
            self.rec, self.name = rec, name

        def __enter__(self):
            assert not self.rec.in_decode, f"{self.name} entered inside a decode scope"
            self.rec.in_decode = self.name == "decoding"
            self.rec._add("enter", self.name)

        def __exit__(self, *exc):
            self.rec.in_decode = False
            self.rec._add("exit", self.name)

    def decoding(self):
        return self._Scope(self, "decoding")

    def decoded(self, images):
        self._add("decoded", tuple(id(i) for i in images))

    def working(self):
        return self._Scope(self, "working")

    def finish(self, index):
        self._add("finish", index)
        return ("done", index)

    def hand_over(self, tensors, done):
        self._add("hand_over", done, tuple(id(t) for t in tensors))

    def wait(self, done):
        self._add("wait", done)


def test_2_each_batch_is_decoded_alone_ordered_by_its_own_event_and_bounded(jpegs):
    recorders: list[Recorder] = []

    def ordering(device):
        recorders.append(Recorder(device))
        return recorders[-1]

    returned: list[tuple] = []
    backend = CountingBackend()

    def logging_backend(datas, device):
        assert recorders[0].in_decode, "a decode call outside the decode stream"
        out = backend(datas, device)
        recorders[0]._add("decode", tuple(id(i) for i in out))
        returned.append(tuple(id(i) for i in out))
        return out

    config = DecodeOn(device="cpu", augment="batched", ahead=2, max_decoded_bytes=3 * 60 * 60 * 3)
    decoder = _decoder(config, backend=logging_backend, ordering=ordering)
    raws = [_raw(jpegs[k : k + 4], index=k) for k in range(0, 12, 4)] * 3  # 9 batches
    got = []
    for batch in decoder.stream(raws):
        got.append(batch)
        # Handed over on its own event before the loop saw it: batch k, never k - 1.
        hand = [e for e in recorders[0].log if e[0] == "hand_over"]
        assert hand[-1][1] == ("done", len(got) - 1)
        assert hand[-1][2] == (id(batch.images), id(batch.labels))
    log = recorders[0].log
    # Every decode call ran alone in the decode scope, and the work waited for it right after (in the
    # thread that decodes: the training thread's hand-overs interleave as they come).
    decoding = {t for t, e in zip(recorders[0].threads, log, strict=True) if e[0] == "decode"}
    own = [e for t, e in zip(recorders[0].threads, log, strict=True) if t in decoding]
    for i, entry in enumerate(own):
        if entry[0] == "decode":
            assert own[i - 1] == ("enter", "decoding") and own[i + 1] == ("exit", "decoding")
            assert own[i + 2] == ("decoded", entry[1])
    assert returned and all(r in [e[1] for e in log if e[0] == "decoded"] for r in returned)
    # Work k is finished before it is handed over, and batches finish in order.
    assert [e[1] for e in log if e[0] == "finish"] == list(range(9))
    # Bounded: before batch k's first decode, the host waited for batch k - ahead - 1.
    first_decode = {}
    k = -1
    for i, entry in enumerate(log):
        if entry == ("enter", "working"):
            k += 1
        if entry[0] == "decode" and k not in first_decode:
            first_decode[k] = i
    for k in range(3, 9):
        waits = [i for i, e in enumerate(log) if e == ("wait", ("done", k - 3))]
        assert waits and waits[0] < first_decode[k], f"batch {k} started before batch {k - 3} was done"


def test_2_one_ordering_serves_every_pass_and_batch(jpegs):
    # A CudaOrdering's streams each hold their own blocks in the caching allocator: new streams every
    # pass left every pass's blocks reserved (83 GB reserved for 2 GB allocated on an H100).
    made: list[Recorder] = []

    def ordering(device):
        made.append(Recorder(device))
        return made[-1]

    decoder = _decoder(DecodeOn(device="cpu", augment="batched", ahead=1), ordering=ordering)
    raws = [_raw(jpegs[k : k + 4], index=k) for k in range(0, 12, 4)]
    for _ in range(3):
        assert len(list(decoder.stream(raws))) == 3
    decoder.decode(raws[0])
    assert len(made) == 1
    assert sum(e == ("enter", "decoding") for e in made[0].log) == 10


# ---- 3: overlap on the host ----------------------------------------------------------------------


def test_3_a_producer_thread_keeps_next_cheap_while_the_step_runs(packed_many):
    def slow(datas, device):
        time.sleep(0.08)  # stands for the decode and the launches of one batch
        return default_backend(torch.device("cpu"))(datas, device)

    def next_times(ahead):
        config = DecodeOn(device="cpu", ahead=ahead)
        ds = ShardDataset(packed_many, batch_size=8, image_size=16, decode_on=config)
        loader = make_loader(ds, num_workers=0)
        loader.decoder.backend = slow
        times = []
        it = iter(loader)
        next(it)
        for _ in range(6):
            time.sleep(0.25)  # the training step
            start = time.perf_counter()
            next(it)
            times.append(time.perf_counter() - start)
        it.close()
        return statistics.median(times)

    inline, threaded = next_times(0), next_times(2)
    assert inline >= 0.08  # without the producer every next() pays for the batch
    assert threaded < 0.02, f"next() took {threaded * 1000:.1f} ms with a producer thread"


def test_3_stopping_early_stops_the_producer(packed_many):
    ds = ShardDataset(packed_many, batch_size=8, image_size=16, decode_on="cpu")
    loader = make_loader(ds, num_workers=0)
    before = {t.name for t in threading.enumerate()}
    it = iter(loader)
    list(islice(it, 2))
    assert "imgshards-decode" in {t.name for t in threading.enumerate()}
    it.close()
    assert {t.name for t in threading.enumerate()} <= before


# ---- 4: device errors propagate, decode errors are halved, not retried per image ---------------


@pytest.mark.parametrize("error", [torch.OutOfMemoryError, torch.AcceleratorError])
def test_4_out_of_memory_and_device_errors_propagate_untried(jpegs, error):
    backend = CountingBackend(fail=lambda datas: error("CUDA out of memory / illegal address"))
    decoder = _decoder(DecodeOn(device="cpu", augment="batched"), backend=backend)
    with pytest.raises(error):
        list(decoder.stream([_raw(jpegs)]))
    assert backend.calls == [12]  # one call, no retry, no CPU fallback
    assert decoder.stats.cpu_fallback == 0


def test_4_a_refused_image_is_found_by_halving_and_decoded_on_the_cpu(jpegs):
    bad = jpegs[9]

    def refuse(datas):
        if any(d.numpy().tobytes() == bad for d in datas):
            return RuntimeError("nvjpeg: unsupported")
        return None

    backend = CountingBackend(fail=refuse)
    config = DecodeOn(device="cpu", augment="per_image")
    got = _decoder(config, backend=backend).decode(_raw(jpegs))
    expected = _decoder(config).decode(_raw(jpegs))
    assert torch.equal(got.images, expected.images) and torch.equal(got.labels, expected.labels)
    assert len(backend.calls) <= 1 + 2 * 4  # log2(12) levels, two calls each; was 1 + 12
    assert backend.calls[0] == 12 and 1 in backend.calls


# ---- 5: the probe: truncated and progressive JPEGs -----------------------------------------------


def test_5_the_probe_sends_truncated_progressive_and_cmyk_files_to_the_cpu():
    im = _photo(60, 80, 0)
    good = _jpeg(im)
    assert probe(good, "jpg") == (True, 60, 80, "")
    assert probe(good[: len(good) * 3 // 4], "jpg").reason == "truncated"  # header intact, no EOI
    assert probe(_jpeg(im, progressive=True), "jpg").reason == "progressive"
    assert probe(_jpeg(im.convert("CMYK")), "jpg").reason == "CMYK"
    png = io.BytesIO()
    im.save(png, "PNG")
    assert probe(png.getvalue(), "png") == (False, 60, 80, "not a JPEG")
    assert probe(b"garbage", "jpg") == (False, 0, 0, "unreadable")


def _lenient(datas, device):
    """Decodes as nvjpeg does: a JPEG cut short comes back as an image (its missing rows gray)."""
    out = []
    for d in datas:
        data = d.numpy().tobytes()
        if data.endswith(b"\xff\xd9"):
            out.append(decode(data, "jpg").to(device))
        else:
            header = jpeg_header(data)
            assert header is not None
            out.append(torch.full((3, header.height, header.width), 128, dtype=torch.uint8, device=device))
    return out


def test_5_a_truncated_jpeg_is_skipped_as_the_workers_skip_it(jpegs):
    cut = jpegs[5][: len(jpegs[5]) * 3 // 4]
    datas = [*jpegs[:5], cut, *jpegs[6:]]
    skipped = []
    decoder = DeviceDecoder(
        DecodeOn(device="cpu", augment="per_image"),
        transform=preset("eval", size=24),
        seed=3,
        rank=0,
        on_corrupt=lambda worker, e: skipped.append(e.key),
        backend=_lenient,
    )
    batch = decoder.decode(_raw(datas))
    assert skipped == ["k5"] and batch.labels.tolist() == [i % 3 for i in range(12) if i != 5]
    assert decoder.stats.fallbacks == {"truncated": 1}


# ---- 6: the pin thread's copy --------------------------------------------------------------------


def test_6_a_raw_batch_is_not_copied_into_pinned_memory(jpegs):
    raw = _raw(jpegs[:3])
    # Before: a copy of every raw batch (and, without a GPU, an error).
    assert raw.pin_memory() is raw


# ---- 7: the resize's layout on a GPU -------------------------------------------------------------


class _ResizeInputs(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.inputs: list[torch.Tensor] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if "upsample_bilinear2d_aa" in str(func):
            self.inputs.append(args[0])
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name", ["train", "resnet"])
def test_7_off_the_cpu_the_antialiased_resize_reads_planar_float(name):
    img = torch.empty((300, 400, 3), dtype=torch.uint8, device="meta").permute(2, 0, 1)  # decode's layout
    with _ResizeInputs() as seen:
        out = preset(name, size=32)(img)
    assert out.shape == (3, 32, 32) and out.dtype == torch.uint8
    (x,) = seen.inputs
    assert x.dtype == torch.float32 and x.is_contiguous()  # was channels-last


def test_7_on_the_cpu_the_resize_stays_uint8_channels_last():
    img = torch.zeros((300, 400, 3), dtype=torch.uint8).permute(2, 0, 1)
    with _ResizeInputs() as seen:
        preset("train", size=32)(img)
    (x,) = seen.inputs
    assert x.dtype == torch.uint8 and x.is_contiguous(memory_format=torch.channels_last)


# ---- 8: the memory figure ------------------------------------------------------------------------


def test_8_the_peak_counts_the_float_region_the_jpeg_copy_and_the_allocators_rounding(jpegs):
    raw = _raw(jpegs)
    size = 24
    config = DecodeOn(device="cpu", augment="batched", ahead=1)
    decoder = _decoder(config, size=size)
    batch = decoder.decode(raw)
    stats = decoder.stats
    shapes = [(40 + 4 * i, 56 - 2 * i) for i in range(12)]
    out = rounded(batch.images.nbytes) + rounded(batch.labels.nbytes)
    float_region = canvas_bytes(shapes) + 4 * 3 * size * size * 12  # canvas and roi_align output
    at_least = rounded(raw.data.numel()) + rounded(float_region) + 2 * out  # + the batch held
    assert stats.peak_bytes >= at_least
    assert stats.peak_bytes <= stats.bound_bytes
    # On a GPU the bound holds the allocator's reserve for the decoder's two streams too.
    kw = dict(raw_bytes=raw.data.numel(), batch=batch, max_decoded_bytes=1 << 20, ahead=1, batched=True)
    assert bound(shapes, cuda=True, **kw) - bound(shapes, cuda=False, **kw) == 2 * (
        LARGE_SEGMENT + SMALL_SEGMENT
    )


def test_8_rounding_follows_the_caching_allocator():
    assert rounded(1) == 512 and rounded(512) == 512 and rounded(513) == 1024
    assert rounded(1 << 20) == 1 << 20 and rounded((1 << 20) + 1) == 2 << 20


# ---- 9: the presets' draws and the default device ------------------------------------------------


@pytest.mark.parametrize("name", ["train", "resnet", "eval"])
def test_9_presets_draw_on_the_cpu_generator_whatever_the_default_device(name):
    img = torch.from_numpy(np.array(_photo(300, 400, 1))).permute(2, 0, 1)
    t = preset(name, size=48)
    torch.manual_seed(5)
    expected = t(img)
    torch.manual_seed(5)
    torch.set_default_device("meta")
    try:
        got = t(img)  # before: torch.rand(23) on the meta device, and .tolist() raised
    finally:
        torch.set_default_device(None)
    assert torch.equal(got, expected)


def test_9_the_device_path_under_another_default_device_gives_the_same_batches(jpegs):
    config = DecodeOn(device="cpu", augment="per_image", ahead=0)
    expected = _decoder(config, transform="resnet").decode(_raw(jpegs))
    torch.set_default_device("meta")
    try:
        got = _decoder(config, transform="resnet").decode(_raw(jpegs))
    finally:
        torch.set_default_device(None)
    assert torch.equal(got.images, expected.images)
    assert torch.equal(to_device(got, "cpu").labels, expected.labels)


# ---- a custom transform ----------------------------------------------------------------------------


def _custom(img: torch.Tensor) -> torch.Tensor:
    """Not a preset: draws from torch's default generator, as a user's transform would."""
    flip = torch.rand(1).item() < 0.5
    out = preset("eval", size=16)(img)
    return out.flip(-1) if flip else out


def test_a_custom_transform_runs_in_the_training_thread_as_in_the_workers(packed_many):
    kw = dict(batch_size=8, transform=_custom, image_size=16, seed=4)
    expected = [to_device(b, "cpu") for b in make_loader(ShardDataset(packed_many, **kw), num_workers=2)]
    loader = make_loader(ShardDataset(packed_many, decode_on="cpu", **kw), num_workers=2)
    assert not loader.decoder.threaded  # the default generator is the training thread's too
    got = list(loader)
    assert len(got) == len(expected)
    for x, y in zip(got, expected, strict=True):
        assert torch.equal(x.images, y.images) and torch.equal(x.labels, y.labels)
    batched = ShardDataset(packed_many, decode_on=DecodeOn(device="cpu", augment="batched"), **kw)
    with pytest.raises(ConfigError, match="augment='batched' applies the presets"):
        make_loader(batched, num_workers=0)
