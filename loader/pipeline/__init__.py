"""One worker's pass: frozen settings in, batches out.

- :mod:`.spec`: :class:`~.spec.Spec`, what a dataset reads and every setting, once, fixed when it
  is made: its parts (one packed split each); and :func:`~.spec.make_spec`, the one builder.
- :mod:`.passes`: a pass of a spec: :func:`~.passes.raw_batches` (plan, read, order, cut, raw
  stages, the zip of several parts) and :func:`~.passes.worker_pass` (decode, image stages,
  collate; or offload).
- :mod:`.splitreader`: :class:`~.splitreader.SplitReader`, the one reader of a packed split for
  every dataset (``ImageFolder`` too): its tables, a run of a shard (a seek checked by the key
  there), one sample by position (checked against the tables), the shards opened (each only while
  the index read is the dataset's), the tables an old index lacks read from the shards.
- :mod:`.runs`: the runs of a plan's shards (each :meth:`~.splitreader.SplitReader.run`: a local
  shard mapped or read in small pieces), cutting them into batches, the per-batch seed.
- :mod:`.tar`: the tar reader, a run of a shard to raw samples (through the converter's tar parser).
- :mod:`.batches`: the batch steps, plain generators over ``(k, [samples])``.
- :mod:`.collate`: the stack of a batch's images into one buffer (:mod:`..state.buffers`'), ``to_device``.
- :mod:`.offload`: ``decode_on``'s :class:`~.offload.RawBatch`, a batch's bytes for the training process.
- :mod:`.steps`: the profiling steps (read, decode, augment, collate) and the clock each worker
  times them with (read by ``imgshards bench``).

What lives here may import :mod:`..epoch`, :mod:`..state`, :mod:`..image`, :mod:`..remote` and the
errors. The public stages, for pipelines built by hand, are :mod:`imgshards.loader.stages`.
"""
