"""Stream packed shards into PyTorch training: shuffled, decoded, augmented and batched in the workers."""

__all__: list[str] = []
