import hashlib
import shutil
import subprocess
import tarfile

import pytest

from imgshards.converter.format.tarwriter import RECORD, TarWriter, _header


def test_headers_are_exactly_tarfiles_ustar_headers():
    for name, size in [("000001.jpg", 0), ("000001.cls", 1), ("123456789.json", 511), ("a.png", 8**10)]:
        info = tarfile.TarInfo(name)
        info.size, info.mode, info.mtime, info.uid, info.gid, info.uname, info.gname = (
            size,
            0o644,
            0,
            0,
            0,
            "",
            "",
        )
        assert _header(name.encode(), size) == info.tobuf(format=tarfile.USTAR_FORMAT)


def test_archive_reads_back_with_tarfile_and_gnu_tar(tmp_path):
    path = tmp_path / "x.tar"
    with open(path, "wb") as f:
        writer = TarWriter(f)
        writer.add("000000.jpg", b"\xff" * 1000)
        writer.add("000000.cls", b"3")
        digest = writer.close()
    assert path.stat().st_size % RECORD == 0
    with tarfile.open(path) as tar:
        assert [(m.name, m.size) for m in tar] == [("000000.jpg", 1000), ("000000.cls", 1)]
        assert tar.extractfile("000000.cls").read() == b"3"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest
    if shutil.which("tar") is None:
        pytest.skip("no tar binary")
    listing = subprocess.run(["tar", "tvf", str(path)], check=True, capture_output=True, text=True).stdout
    assert "000000.jpg" in listing and "0/0" in listing
