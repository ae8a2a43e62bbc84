"""Reading shards from where they live: a local directory, or any fsspec URL with a bounded local cache.

:class:`ShardSource` (:mod:`.source`) opens a split's shards for the tar reader; a remote shard is
streamed in ranged requests (:mod:`.ranges`) and, with a cache directory, written into a bounded
cache shared by the processes of a machine (:mod:`.cache`).
"""

from .cache import ShardCache
from .ranges import RetryPolicy
from .source import ShardSource

__all__ = ["RetryPolicy", "ShardCache", "ShardSource"]
