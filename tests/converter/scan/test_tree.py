import os
from pathlib import Path

import pytest
from torchvision.datasets import ImageFolder

from imgshards.converter import Reason, SourceError, scan_tree


def _touch_jpeg(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


@pytest.fixture
def messy_tree(tmp_path, tiny_tree):
    """A tree ImageFolder can list: nested folders, upper-case extensions, a symlinked folder;
    plus files it would skip or choke on."""
    jpeg = next(tiny_tree.rglob("*.JPEG")).read_bytes()
    root = tmp_path / "src"
    for rel in [
        "b/x.jpg",
        "b/sub/y.JPG",
        "b/sub b/z.jpeg",
        "b/sub/deeper/w.png",
        "a/1.JPEG",
        "a/0.jpg",
        "c d/é.webp",
        "elsewhere/linked.jpg",
    ]:
        _touch_jpeg(root / rel if not rel.startswith("elsewhere") else tmp_path / rel, jpeg)
    (root / "a" / "notes.txt").write_text("hi")
    (root / "README.md").write_text("loose file")
    os.symlink(tmp_path / "elsewhere", root / "a" / "linked-dir")
    os.symlink(root / "b", root / "b" / "sub" / "loop")
    os.symlink(root / "missing.jpg", root / "c d" / "broken.jpg")
    return root


def test_scan_matches_imagefolder_order_and_labels(messy_tree):
    # Build ImageFolder's view on a copy without the loop (it would walk it until ELOOP).
    scan = scan_tree(messy_tree)
    folder = ImageFolder(
        str(messy_tree),
        is_valid_file=lambda p: (
            "loop" not in p and os.path.exists(p) and p.lower().endswith((".jpg", ".jpeg", ".png", ".webp"))
        ),
    )
    assert list(scan.classes) == folder.classes
    expected = [(os.path.relpath(p, messy_tree), label) for p, label in folder.samples]
    assert list(zip(scan.paths, scan.labels.tolist(), strict=True)) == expected
    assert scan.sizes.tolist() == [os.path.getsize(messy_tree / p) for p, _ in expected]


def test_scan_reports_every_file_it_skips(messy_tree):
    scan = scan_tree(messy_tree)
    rejects = {r.path: r.reason for r in scan.rejects}
    assert rejects == {
        "README.md": Reason.OUTSIDE_CLASS_DIR,
        "a/notes.txt": Reason.UNSUPPORTED_EXTENSION,
        "b/sub/loop": Reason.SYMLINK_LOOP,
        "c d/broken.jpg": Reason.BROKEN_SYMLINK,
    }


def test_scan_errors_name_the_problem(tmp_path):
    with pytest.raises(SourceError, match="does not exist"):
        scan_tree(tmp_path / "nope")
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "a.jpg").write_bytes(b"x")
    with pytest.raises(SourceError, match="no class directories"):
        scan_tree(tmp_path / "flat")
    (tmp_path / "t" / "cat").mkdir(parents=True)
    (tmp_path / "t" / "dog").mkdir()
    (tmp_path / "t" / "dog" / "d.jpg").write_bytes(b"x")
    (tmp_path / "t" / "cat" / "readme.txt").write_text("no images here")
    with pytest.raises(SourceError, match=r"no image in .*: cat\b"):
        scan_tree(tmp_path / "t")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads everything")
def test_unreadable_class_subdirectory_is_reported(tmp_path, tiny_tree):
    root = tmp_path / "src"
    _touch_jpeg(root / "a" / "ok.jpg", b"x")
    (root / "a" / "locked").mkdir()
    (root / "a" / "locked").chmod(0)
    try:
        scan = scan_tree(root)
    finally:
        (root / "a" / "locked").chmod(0o755)
    assert [(r.path, r.reason) for r in scan.rejects] == [("a/locked", Reason.UNREADABLE)]


def test_path_table_is_compact(tiny_tree):
    scan = scan_tree(tiny_tree)
    assert scan.paths.nbytes < sum(len(p) + 9 for p in scan.paths)
