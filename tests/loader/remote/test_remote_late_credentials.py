"""Credentials set in the environment after a first loader ran reach a later loader's workers.

Workers are forked when their loader starts (loader/workers.py), so they see the environment of that
moment. Run as a script of its own (a user's training script: no ``__main__`` guard), with its first
loader's worker queues and fsspec's threads alive when the second loader starts.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

from imgshards.converter import PackConfig, pack_to_url, read_manifest
from imgshards.loader import ShardDataset, make_loader

SCRIPT = """
import hashlib, json, os, sys
from imgshards.loader import ShardDataset, make_loader

first_url, s3_url, endpoint = sys.argv[1:4]
first = make_loader(ShardDataset(first_url, mode="eval", transform="eval", image_size=32, batch_size=8),
                    num_workers=2)
first_count = sum(len(b.labels) for b in first)
os.environ["AWS_ACCESS_KEY_ID"] = os.environ["AWS_SECRET_ACCESS_KEY"] = "testing"  # set late
later = ShardDataset(s3_url, mode="eval", transform="eval", image_size=32, batch_size=8,
                     storage_options={"endpoint_url": endpoint})
samples = [
    f"{label}:{hashlib.sha1(image.numpy().tobytes()).hexdigest()}"
    for batch in make_loader(later, num_workers=2)
    for image, label in zip(batch.images, batch.labels.tolist())
]
print(json.dumps({"first": first_count, "samples": samples}))
"""


def test_s3_credentials_set_after_a_first_loader_give_the_whole_epoch(
    s3, s3_endpoint, remote_tree, remote_packed, http_serve, tmp_path
):
    bucket, options = s3
    url = f"{bucket}/late"
    pack_to_url(remote_tree, url, PackConfig(shard_size=30_000, workers=2), storage_options=options)
    base, _ = http_serve(remote_packed)
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    done = subprocess.run(
        [sys.executable, str(script), base, url, s3_endpoint],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.splitlines()[-1])
    local = ShardDataset(remote_packed, mode="eval", transform="eval", image_size=32, batch_size=8)
    expected = [
        f"{label}:{hashlib.sha1(image.numpy().tobytes()).hexdigest()}"
        for batch in make_loader(local, num_workers=0)
        for image, label in zip(batch.images, batch.labels.tolist(), strict=True)
    ]
    assert got["first"] == read_manifest(remote_packed).split("train").samples == len(expected)
    assert sorted(got["samples"]) == sorted(expected)  # every sample once, with its label
