"""A worker's pass, its stages in the order a sample goes through them.

- :mod:`.passes`: :func:`~.passes.worker_pass`, the one function that lists every stage of a pass
  (plan, read, order, cut, raw stages, decode, image stages, collate), with what flows out of each.
- :mod:`.read`: the raw-sample stages: reading runs of a shard, cutting batches, the per-batch seed.
- :mod:`.reader`: the tar reader, a run of a shard to raw samples (through the converter's tar parser).
- :mod:`.batch`: :class:`~.batch.Batch`, the collate into reused buffers, ``to_device``.
- :mod:`.steps`: the profiling steps (read, decode, augment, collate) and the clock each worker
  times them with (read by ``imgshards bench``).

The decoder and the presets live in :mod:`imgshards.loader.image`, the offload to the training
process in :mod:`imgshards.loader.device`, and the public stages, for pipelines built by hand, in
:mod:`imgshards.loader.stages`.
"""
