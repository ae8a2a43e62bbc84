"""Who reads what, in which order, with which random numbers: pure functions, no I/O.

- :mod:`.seeds`: every random stream and seed of an epoch, derived from ``(seed, epoch, ...)`` with
  one tag each (shard order, dropped run, worker order, augmentation, user stages, mixing).
"""
