"""Who reads what, in which order, with which random numbers: pure functions of the settings, no I/O.

- :mod:`.partition`: an epoch's layout: shard order, the dropped run, batches per rank, each
  worker's plan (segments of shards, block-cyclic in train mode).
- :mod:`.order`: a worker's sample order (interleave, buffer shuffle): :func:`~.order.worker_order`,
  the one function both the read and the elastic replay call.
- :mod:`.elastic`: plans after a resume onto another topology (an epoch in legs).
- :mod:`.seeds`: every random stream and seed, with its tag.
"""
