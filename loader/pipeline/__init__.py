"""A worker's pass, its stages in the order a sample goes through them.

- :mod:`.passes`: :func:`~.passes.worker_pass`, the one function that lists every stage of a pass
  (plan, read, order, cut, raw stages, decode, image stages, collate), with what flows out of each.
- :mod:`.read`: the raw-sample stages: reading runs of a shard, cutting batches, the per-batch seed.
- :mod:`.stagetimes`: the clock each worker times its stages with (read by ``imgshards bench``).

The tar reader (:mod:`imgshards.loader.reader`), the decoder (:mod:`imgshards.loader.decode`), the
presets, the collate and the offload to the training process live beside this package, and the
public stages, for pipelines built by hand, in :mod:`imgshards.loader.stages`.
"""
