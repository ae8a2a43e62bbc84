"""Where an epoch and a pass stand, and what a checkpoint holds.

- :mod:`.progress`: :class:`~.progress.EpochProgress`, the half of a dataset that changes as it is
  read (the other, its frozen spec, is :mod:`..pipeline.spec`): the epoch, the ranks settled as
  each pass starts, this process's place in its pass, the loss counters, the end of a pass's
  accounting (its warnings and ``check_lost``), and the dataset's torchdata ``Stateful`` protocol.
- :mod:`.cursor`: the state shared with the DataLoader workers, in shared memory: the epoch cursor
  (:class:`~.cursor.EpochCursor`, its one owner), the skip counters (:class:`~.cursor.Counters`,
  whose ``skip`` is the one skip-count-warn of an unusable sample), the batch-buffer flags.
- :mod:`.buffers`: :class:`~.buffers.Batch` and the shared-memory buffers a worker stacks batches
  into and the training process hands back (:class:`~.buffers.BufferPool`), how a batch crosses.
- :mod:`.checkpoint`: the resume state format (:class:`~.checkpoint.ResumeState`) and its checks.
- :mod:`.ranks`: rank and world size, settled as a pass starts.
"""
