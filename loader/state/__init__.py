"""Where an epoch and a pass stand, and what a checkpoint holds.

- :mod:`.cursor`: the state shared with the DataLoader workers, in shared memory: the epoch cursor
  (:class:`~.cursor.EpochCursor`, its one owner), the skip counters, the batch-buffer flags.
- :mod:`.checkpoint`: :class:`~.checkpoint.PassPosition` (where one process's pass stands), the
  resume state format and its checks, the dataset's torchdata ``Stateful`` protocol and counters.
"""
