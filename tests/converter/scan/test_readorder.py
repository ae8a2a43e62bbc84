"""--read-order: the probe tells a warm tree from a cold one; both orders give the same bytes."""

import os
import shutil

from imgshards.converter import PackConfig, ReadOrder, pack, scan_tree
from imgshards.converter.scan.readorder import cached_share, choose_read_order


def _outputs(root):
    files = [*root.iterdir(), *root.glob(".imgshards/rejects/*")]
    return {str(p.relative_to(root)): p.read_bytes() for p in files if p.is_file()}


def test_the_probe_tells_a_warm_tree_from_a_cold_one(tiny_tree, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(tiny_tree, src)
    scan = scan_tree(src)
    for path in scan.paths:  # read: in the page cache
        (src / path).read_bytes()
    assert cached_share(scan) == 1.0
    assert choose_read_order(ReadOrder.AUTO, scan) is ReadOrder.PLAN
    for path in scan.paths:  # written back and dropped from the page cache
        fd = os.open(src / path, os.O_RDONLY)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    assert cached_share(scan) == 0.0
    assert choose_read_order(ReadOrder.AUTO, scan) is ReadOrder.DISK
    assert cached_share(scan) == 0.0  # the probe itself reads nothing into the cache
    assert choose_read_order(ReadOrder.PLAN, scan) is ReadOrder.PLAN


def test_both_read_orders_give_the_same_bytes(mixed_tree, tmp_path):
    runs = {}
    for order in ("disk", "plan"):
        result = pack(
            mixed_tree, tmp_path / order, PackConfig(shard_size=30_000, workers=2, read_order=order)
        )
        assert result.read_order == order
        runs[order] = _outputs(tmp_path / order)
    assert runs["disk"] == runs["plan"]
    assert not (tmp_path / "plan" / ".imgshards" / "train" / "buckets").exists()
