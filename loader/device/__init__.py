"""The GPU path, ``ShardDataset(decode_on=...)``: the workers send raw batches, the training process decodes.

- :mod:`.decoding`: :class:`~.decoding.DeviceDecoder`, raw batches to normalized batches on the
  device, its work done in a producer thread ``ahead`` batches ahead.
- :mod:`.backends`: the batched JPEG decoders (nvjpeg, or the workers' decoder on the CPU) and the
  header probe choosing which decoder takes a sample.
- :mod:`.streams`: the CUDA streams and events a batch's work runs on, and the rules they follow.
- :mod:`.augment`: the presets applied to many images at once (``augment="batched"``).
- :mod:`.memory`: the device memory of a batch, as the CUDA caching allocator counts it.
- :mod:`.marks`: what the decoder did (batches, time per step, fallbacks, peak memory).

What a worker sends (:class:`~imgshards.loader.pipeline.offload.RawBatch`) is the pass's, in
:mod:`..pipeline.offload`. What lives here may import :mod:`..pipeline` (raw batches, the tar
reader's helpers, the per-batch seed, the step names), :mod:`..image` (the CPU decoder and the
presets it matches), :mod:`..epoch` and the errors; the pass never imports it.
"""
