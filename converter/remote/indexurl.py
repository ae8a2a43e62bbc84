"""Write a dataset's index at a URL: ``_info.json``, then ``index.json``, as a pack ends.

Apart from the upload (:mod:`.upload`), which runs a whole pack: ``index`` writes the index of
shards already at a URL with this alone.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ..format.manifest import INDEX_NAME, TIMM_INFO_NAME, Manifest
from ..format.remotefs import DEFAULT_TIMEOUT, Remote, with_timeouts

__all__ = ["write_index_url"]


def write_index_url(
    url: str, manifest: Manifest, *, storage_options: Mapping[str, Any] | None = None
) -> None:
    """Write ``_info.json``, then ``index.json`` at ``url``, each whole or not at all (as a pack ends).

    Raises:
        DestinationError: a write kept failing.

    """
    remote = Remote(url, with_timeouts(url, storage_options, DEFAULT_TIMEOUT))
    remote.put_bytes(TIMM_INFO_NAME, (json.dumps(manifest.timm_info(), indent=1) + "\n").encode())
    remote.put_bytes(INDEX_NAME, manifest.dumps().encode())
