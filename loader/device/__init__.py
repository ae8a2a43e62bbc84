"""The GPU path, ``ShardDataset(decode_on=...)``: the workers send raw batches, the training process decodes.

- :mod:`.offload`: :data:`~.offload.DecodeOn` and the :class:`~.offload.RawBatch` a worker sends.
- :mod:`.decoder`: :class:`~.decoder.DeviceDecoder`, raw batches to normalized batches on the
  device, its work done in a producer thread ``ahead`` batches ahead.
- :mod:`.backends`: the batched JPEG decoders (nvjpeg, or the workers' decoder on the CPU) and the
  header probe choosing which decoder takes a sample.
- :mod:`.streams`: the CUDA streams and events a batch's work runs on, and the rules they follow.
- :mod:`.augment`: the presets applied to many images at once (``augment="batched"``).
- :mod:`.memory`: the device memory of a batch, as the CUDA caching allocator counts it.
- :mod:`.marks`: what the decoder did (batches, time per step, fallbacks, peak memory).

What lives here may import :mod:`..image` (the CPU decoder and the presets it matches), the pass's
:mod:`..pipeline` modules (batches, the tar reader, the per-batch seed, the step names), the
seeds, the cursor's counters and the errors; never the dataset at run time (a type only), so the
dataset and the workers import :mod:`.offload` without a cycle.
"""
