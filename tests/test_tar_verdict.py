"""One verdict on every tar (issue 21): ``index``, ``verify`` and the loader read shards through one parser.

Each hostile shard is built here, from raw header bytes or ``tarfile`` in its GNU and pax formats.
Every sample is then either counted alike by all three (index's count and per-class counts, verify
passing, the loader delivering each sample once with its label), or refused by ``index`` with the
reason, ``verify`` finding a problem in it too. The fuzz test at the end mixes the same member kinds
at random.

The one parser: converter/format/tarstream.py (the members), converter/format/tarsamples.py (the
samples) and converter/format/labels.py (the one reading of a label member).
"""

from __future__ import annotations

import hashlib
import io
import json
import random
import tarfile
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from imgshards.cli.main import cli
from imgshards.converter import IndexConfig, LabelSource, ShardInfo, index, read_manifest, verify
from imgshards.converter.format.errors import UnreadableSamplesError
from imgshards.converter.format.tarstream import MAX_EXTENDED_HEADER
from imgshards.converter.shards.read import scan_shard
from imgshards.converter.shards.verify import check_shard_stream
from imgshards.loader.pipeline.tar import read_run

JPG = b"\xff\xd8\xff\xe0" + bytes(range(256)) * 3 + b"\xff\xd9"  # never decoded here: bytes to carry

# ---- raw tar members -----------------------------------------------------------------------------


def header(
    name: bytes,
    size: int,
    kind: bytes = b"0",
    *,
    prefix: bytes = b"",
    magic: bytes = b"ustar\x0000",
    size_field: bytes | None = None,
    checksum: bytes = b"%06o\0 ",
) -> bytes:
    h = bytearray(512)
    h[0 : len(name[:100])] = name[:100]
    h[100:108] = b"0000644\0"
    h[108:116] = h[116:124] = b"0000000\0"
    h[124:136] = size_field if size_field is not None else b"%011o\0" % size
    h[136:148] = b"00000000000\0"
    h[156:157] = kind
    h[257:265] = magic
    h[345 : 345 + len(prefix)] = prefix
    h[148:156] = b" " * 8
    h[148:156] = checksum % sum(h)
    return bytes(h)


def pad(data: bytes) -> bytes:
    return data + bytes(-len(data) % 512)


def member(name: str | bytes, data: bytes, kind: bytes = b"0", **kw) -> bytes:
    raw = name.encode() if isinstance(name, str) else name
    return header(raw, len(data), kind, **kw) + pad(data)


def pax(records: dict[bytes, bytes], kind: bytes = b"x") -> bytes:
    body = b""
    for key, value in records.items():
        text = b" " + key + b"=" + value + b"\n"
        n = len(text) + 1
        while len(str(n).encode()) + len(text) != n:
            n += 1
        body += str(n).encode() + text
    return member(b"././@PaxHeader", body, kind)


def long_name(name: bytes, kind: bytes = b"L") -> bytes:
    return member(b"././@LongLink", name + b"\0", kind, magic=b"ustar  \0")


def sample(key: str, label: object = None, i: int = 0) -> bytes:
    label = i % 2 if label is None else label
    cls = label if isinstance(label, bytes) else str(label).encode()
    return (
        member(f"{key}.jpg", JPG + bytes([i]))
        + member(f"{key}.cls", cls)
        + member(f"{key}.json", json.dumps({"label": i % 2}).encode())
    )


def tar(*members: bytes) -> bytes:
    return b"".join(members) + bytes(1024)


def plain(n: int = 4, **labels: object) -> list[bytes]:
    return [sample(f"k{i}", labels.get(f"k{i}"), i) for i in range(n)]


def with_tarfile(fmt: int, names: list[str]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as t:
        for i, key in enumerate(names):
            for ext, data in (("jpg", JPG + bytes([i])), ("cls", str(i % 2).encode())):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    return out.getvalue()


def pax_size_override() -> bytes:
    # The image's header says 0 bytes; its pax header says how many there are (as for 8 GiB and more).
    image = JPG + b"\x01"
    return tar(
        sample("k0", i=0),
        pax({b"size": str(len(image)).encode()}),
        header(b"k1.jpg", 0, size_field=b"%011o\0" % 0) + pad(image),
        member("k1.cls", b"1"),
        sample("k2", i=2),
        sample("k3", i=3),
    )


def gnu_sparse() -> bytes:
    return tar(sample("k0", i=0), member("k1.jpg", JPG, b"S", magic=b"ustar  \0"), member("k1.cls", b"1"))


def pax_sparse(version: dict[bytes, bytes]) -> bytes:
    return tar(
        sample("k0", i=0),
        pax({**version, b"GNU.sparse.name": b"k1.jpg", b"GNU.sparse.realsize": b"2048"}),
        member("./GNUSparseFile.0/k1.jpg", JPG),
        member("k1.cls", b"1"),
        sample("k2", i=2),
        sample("k3", i=3),
    )


def number_forms() -> bytes:
    # 12 octal digits and no end in the size field, a 7-digit checksum: both valid, both rare
    image = JPG + b"\x01"
    odd = header(b"k1.jpg", 0, size_field=b"%012o" % len(image), checksum=b"%07o\0") + pad(image)
    return tar(sample("k0", i=0), odd, member("k1.cls", b"1", checksum=b"%07o "))


def base256_size() -> bytes:
    image = JPG + b"\x01"
    field = b"\x80" + len(image).to_bytes(11, "big")
    return tar(sample("k0", i=0), header(b"k1.jpg", 0, size_field=field) + pad(image), member("k1.cls", b"1"))


def near_the_cap() -> bytes:
    key = b"y" * (MAX_EXTENDED_HEADER - 16) + b"/k1"  # with ".jpg" and the NUL: just within the cap
    return tar(
        sample("k0", i=0),
        long_name(key + b".jpg") + member("a.jpg", JPG),
        long_name(key + b".cls") + member("a.cls", b"1"),
        *plain()[2:],
    )


MiB2 = b"d" * (2 << 20)

# name -> (shard bytes, samples counted by all three) or (shard bytes, the reason index gives)
COUNTED = {
    "ustar": (tar(*plain()), 4),
    "ustar-prefix": (
        tar(
            *[
                member(f"k{i}.{e}", d, prefix=b"dir/sub")
                for i in range(4)
                for e, d in (("jpg", JPG), ("cls", b"1"))
            ]
        ),
        4,
    ),
    "gnu-long-names": (with_tarfile(tarfile.GNU_FORMAT, [f"{'g' * 300}/k{i}" for i in range(4)]), 4),
    "pax-long-names": (with_tarfile(tarfile.PAX_FORMAT, [f"{'p' * 300}/é-k{i}" for i in range(4)]), 4),
    "gnu-long-names-at-the-cap": (near_the_cap(), 4),
    "pax-size-override": (pax_size_override(), 4),
    "base-256-size": (base256_size(), 2),
    "number-field-forms": (number_forms(), 2),
    "global-pax-comment": (tar(pax({b"comment": b"git archive"}, b"g"), *plain()), 4),
    "links-dirs-and-no-extension-members": (
        tar(
            member("dir", b"", b"5"),
            sample("k0", i=0),
            member("k0-link", b"", b"2"),
            member("README", b"notes"),
            *plain()[1:],
        ),
        4,
    ),
    "cls-with-a-line-end": (tar(*plain(k1=b"1\n", k2=b"0\r\n")), 4),
}
REFUSED = {
    "gnu-long-name-2-MiB": (tar(sample("k0", i=0), long_name(MiB2 + b"/k1.jpg"), *plain()[1:]), "declares"),
    "pax-path-2-MiB": (tar(sample("k0", i=0), pax({b"path": MiB2 + b"/k1.jpg"}), *plain()[1:]), "declares"),
    "gnu-sparse": (gnu_sparse(), "GNU sparse file"),
    "solaris-extended-header": (tar(sample("k0"), pax({b"path": b"k9.jpg"}, b"X"), *plain()[1:]), "Solaris"),
    "pax-sparse-1.0": (pax_sparse({b"GNU.sparse.major": b"1", b"GNU.sparse.minor": b"0"}), "sparse"),
    "pax-sparse-0.1": (pax_sparse({b"GNU.sparse.numblocks": b"1", b"GNU.sparse.map": b"0,1"}), "sparse"),
    "keys-repeated-apart": (
        tar(sample("k0"), sample("k1", i=1), sample("k0", i=2), sample("k2")),
        "repeats the key",
    ),
    "member-twice-in-a-sample": (
        tar(sample("k0"), member("k1.jpg", JPG), sample("k1", i=1)),
        "more than once",
    ),
    "nul-in-a-name": (tar(sample("k0"), member(b"k1\0x.jpg", JPG), member("k1.cls", b"1")), "NUL"),
    "nul-in-a-long-name": (tar(sample("k0"), long_name(b"k1\0x.jpg"), member("k1.jpg", JPG)), "NUL"),
    "nul-in-a-pax-path": (tar(sample("k0"), pax({b"path": b"k1\0.jpg"}), member("k1.jpg", JPG)), "NUL"),
    "pax-size-past-the-end": (
        tar(sample("k0"), pax({b"size": b"99999999"}), member("k1.jpg", JPG)),
        "declares",
    ),
    "global-pax-path": (tar(pax({b"path": b"x.jpg"}, b"g"), *plain()), "global pax header"),
    "image-is-a-symlink": (
        tar(sample("k0"), member("k1.jpg", b"", b"2"), member("k1.cls", b"1")),
        "not one image",
    ),
    "hard-link-with-data": (
        tar(sample("k0"), member("k1.jpg", JPG, b"1"), member("k1.cls", b"1")),
        "declaring",
    ),
    "bad-checksum": (
        tar(sample("k0"), member("k1.jpg", JPG)[:148] + b"0000000\0" + member("k1.jpg", JPG)[156:]),
        "checksum",
    ),
    **{
        f"cls-{label!r}": (tar(*plain(k1=label.encode())), "holds both class ids and names")
        for label in ("+1", " 1", "\u0661", "1_0")
    },
}


def write_shard(root: Path, data: bytes) -> Path:
    root.mkdir()
    path = root / "s-000000.tar"
    path.write_bytes(data)
    return path


def loader_reads(
    path: Path, samples: int, labels: LabelSource, classes: tuple[str, ...]
) -> tuple[list, list]:
    lost: list[str] = []
    corrupt: list[Exception] = []
    delivered = list(
        read_run(
            path,
            0,
            samples,
            labels=labels,
            class_to_idx={c: i for i, c in enumerate(classes)},
            num_classes=len(classes),
            on_truncated=lost.append,
            on_corrupt=corrupt.append,
        )
    )
    return delivered, [*lost, *corrupt]


@pytest.mark.parametrize("case", sorted(COUNTED))
def test_a_shard_counted_by_index_is_counted_alike_by_verify_and_the_loader(tmp_path, case):
    data, n = COUNTED[case]
    path = write_shard(tmp_path / "ds", data)
    index(tmp_path / "ds", IndexConfig(workers=1))
    manifest = read_manifest(tmp_path / "ds")
    split = manifest.split("train")
    assert split.samples == n
    report = verify(tmp_path / "ds", workers=1)
    assert report.ok, report.problems
    delivered, problems = loader_reads(path, n, split.labels, manifest.classes)
    assert not problems
    assert len(delivered) == n and len({s.key for s in delivered}) == n
    assert (
        tuple(Counter(s.label for s in delivered)[i] for i in range(len(manifest.classes)))
        == split.class_counts
    )
    assert all("GNUSparseFile" not in s.key and "\0" not in s.key for s in delivered)
    if case == "pax-size-override":  # the loader reads the size the pax header gives
        assert bytes(delivered[1].data) == JPG + b"\x01"
    if case == "ustar-prefix":
        assert delivered[0].key == "dir/sub/k0"


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_shard_index_refuses_is_refused_with_its_reason_and_verify_finds_it(tmp_path, case):
    data, reason = REFUSED[case]
    path = write_shard(tmp_path / "ds", data)
    with pytest.raises(UnreadableSamplesError, match=reason) as refused:
        index(tmp_path / "ds", IndexConfig(workers=1))
    assert "\n" not in str(refused.value)
    assert not (tmp_path / "ds" / "index.json").exists()
    # verify, given the entry index would have written for the samples meant (4), finds a problem too
    meant = ShardInfo(path.name, 4, len(data), hashlib.sha256(data).hexdigest())
    problems, _ = check_shard_stream(lambda: path.open("rb"), meant, 2)
    assert problems
    delivered, _ = loader_reads(path, 4, LabelSource(), ("0", "1"))
    assert all("GNUSparseFile" not in s.key and "\0" not in s.key for s in delivered)


@pytest.mark.filterwarnings("ignore:The image decoding and encoding:DeprecationWarning")
def test_shard_dataset_delivers_what_index_counted_through_long_names_and_pax_sizes(tmp_path, tiny_tree):
    """The whole loader (ShardDataset, make_loader), not only its reader, on real JPEGs."""
    torch = pytest.importorskip("torch")
    from imgshards.loader import ShardDataset, make_loader

    jpegs = sorted(tiny_tree.rglob("*.JPEG"))[:8]
    parts = []
    for i, path in enumerate(jpegs):
        image, key = path.read_bytes(), f"{'n' * 150}/k{i}"
        if i % 2:  # a pax size (the header field says 0) under a GNU long name
            parts.append(long_name(f"{key}.jpg".encode()) + pax({b"size": str(len(image)).encode()}))
            parts.append(header(b"x.jpg", 0) + pad(image))
        else:
            parts.append(pax({b"path": f"{key}.jpg".encode()}) + member("x.jpg", image))
        parts.append(long_name(f"{key}.cls".encode()) + member("x.cls", str(i % 3).encode()))
    write_shard(tmp_path / "ds", tar(*parts))
    index(tmp_path / "ds", IndexConfig(workers=1))
    split = read_manifest(tmp_path / "ds").split("train")
    assert split.samples == 8 and split.class_counts == (3, 3, 2)
    assert verify(tmp_path / "ds", workers=1).ok
    ds = ShardDataset(tmp_path / "ds", mode="eval", batch_size=3, transform=torch.nn.Identity())
    labels = [int(label) for batch in make_loader(ds, num_workers=0) for label in batch[1]]
    assert sorted(labels) == [0, 0, 0, 1, 1, 1, 2, 2]
    assert ds.corrupt_skipped == ds.truncated_shards == 0


@pytest.mark.parametrize(
    ("labels", "code", "message"),
    [
        ([0, "+1", 1], 1, "holds both class ids and names"),  # once a Counter overwrote counts: exit 2
        (["0", "1"], 0, ""),
    ],
)
def test_cli_index_on_odd_cls_labels_exits_with_one_line(tmp_path, labels, code, message):
    write_shard(tmp_path / "ds", tar(*[sample(f"k{i}", str(v), i) for i, v in enumerate(labels)]))
    result = CliRunner().invoke(cli, ["index", str(tmp_path / "ds")])
    assert result.exit_code == code, result.output
    assert message in result.output and "Traceback" not in result.output


def test_a_json_label_nested_60000_deep_is_a_reason_not_a_traceback(tmp_path):
    deep = b'{"label": ' + b"[" * 60_000
    write_shard(
        tmp_path / "ds",
        tar(
            sample("k0"),
            member("k1.jpg", JPG),
            member("k1.json", deep),
            member("k1.cls", b"1"),
        ),
    )
    result = CliRunner().invoke(cli, ["index", str(tmp_path / "ds"), "--label-field", "label"])
    assert result.exit_code == 1, result.output
    assert "sample 'k1' has a .json that is not JSON" in result.output
    assert "Traceback" not in result.output and "RecursionError" not in result.output


# ---- fuzz: member kinds mixed at random --------------------------------------------------------

KINDS = [
    "plain", "plain", "plain", "gnu-long", "pax-path", "pax-size", "prefix", "dir", "symlink",
    "no-ext", "global-comment", "gnu-sparse", "pax-sparse", "nul", "repeat-key", "twice",
    "odd-label", "big-long-name", "bad-checksum", "line-end-label", "number-forms",
]  # fmt: skip


def fuzz_sample(rng: random.Random, i: int, keys: list[str]) -> bytes:
    kind = rng.choice(KINDS)
    key = f"k{i}"
    label = str(rng.randrange(2)).encode()
    image = JPG + bytes([i % 256])
    image_member = member(f"{key}.jpg", image)
    extra = b""
    if kind == "gnu-long":
        key = "g" * rng.randrange(90, 400) + f"/{key}"
        image_member = long_name(f"{key}.jpg".encode()) + member("x.jpg", image)
    elif kind == "pax-path":
        key = "p" * rng.randrange(90, 400) + f"/é{key}"
        image_member = pax({b"path": f"{key}.jpg".encode()}) + member("x.jpg", image)
    elif kind == "pax-size":
        image_member = (
            pax({b"size": str(len(image)).encode()}) + header(f"{key}.jpg".encode(), 0) + pad(image)
        )
    elif kind == "prefix":
        image_member = member(f"{key}.jpg", image, prefix=b"pre")
        key = f"pre/{key}"
    elif kind == "dir":
        extra = member(f"{key}-dir", b"", b"5")
    elif kind == "symlink":
        extra = member(f"{key}-link.txt", b"", b"2")
    elif kind == "no-ext":
        extra = member(f"{key}-notes", b"free text")
    elif kind == "global-comment":
        extra = pax({b"comment": b"x"}, b"g")
    elif kind == "gnu-sparse":
        image_member = member(f"{key}.jpg", image, b"S", magic=b"ustar  \0")
    elif kind == "pax-sparse":
        image_member = pax({b"GNU.sparse.major": b"1", b"GNU.sparse.minor": b"0"}) + member(
            f"./GNUSparseFile.0/{key}.jpg", image
        )
    elif kind == "nul":
        image_member = member(f"{key}\0z.jpg".encode(), image)
    elif kind == "repeat-key" and keys:
        key = rng.choice(keys)
        image_member = member(f"{key}.jpg", image)
    elif kind == "twice":
        image_member += member(f"{key}.jpg", image)
    elif kind == "odd-label":
        label = rng.choice([b"+1", b" 1", "\u0661".encode(), b"1_0", b"", b"-1", b"x" * 70_000])
    elif kind == "line-end-label":
        label += b"\n"
    elif kind == "big-long-name":
        image_member = long_name(b"b" * (MAX_EXTENDED_HEADER + 1)) + member("x.jpg", image)
    elif kind == "number-forms":
        odd = header(f"{key}.jpg".encode(), 0, size_field=b"%012o" % len(image), checksum=b"%07o\0")
        image_member = odd + pad(image)
    elif kind == "bad-checksum":
        raw = bytearray(member(f"{key}.jpg", image))
        raw[150] ^= 1
        image_member = bytes(raw)
    keys.append(key)
    return extra + image_member + member(f"{key}.cls", label)


@pytest.mark.timeout(60)
def test_fuzzed_member_kinds_get_one_verdict_from_index_verify_and_loader(tmp_path):
    rng = random.Random(21)
    path = tmp_path / "s.tar"
    counted = refused = 0
    for _ in range(600):
        keys: list[str] = []
        meant = rng.randint(1, 5)
        data = tar(*[fuzz_sample(rng, i, keys) for i in range(meant)])
        if rng.random() < 0.1:
            data = data[: rng.randrange(len(data))]  # cut anywhere
        path.write_bytes(data)
        scan = scan_shard(lambda: path.open("rb"), path.name, None)  # what index reads and judges
        kinds = {type(v) for v in scan.values}
        if scan.bad or len(kinds) != 1:  # index refuses the shard (a bad sample, or ids and names mixed)
            refused += 1
            entry = ShardInfo(path.name, meant, len(data), hashlib.sha256(data).hexdigest())
            assert check_shard_stream(lambda: path.open("rb"), entry, 2)[0], data[:2000]
            delivered, _ = loader_reads(path, meant, LabelSource(), ("0", "1"))
            assert all("GNUSparseFile" not in s.key and "\0" not in s.key for s in delivered)
            continue
        counted += 1
        names = kinds == {str}
        classes = (
            tuple(sorted(map(str, scan.values))) if names else tuple(map(str, range(max(scan.values) + 1)))
        )
        labels = LabelSource(names=names)
        to_idx = {c: i for i, c in enumerate(classes)}
        problems, verified = check_shard_stream(
            lambda: path.open("rb"), scan.info, len(classes), labels, to_idx
        )
        assert not problems, (problems, data[:2000])
        delivered, lost = loader_reads(path, scan.info.samples, labels, classes)
        assert not lost and len(delivered) == scan.info.samples
        by_index = Counter({(to_idx[v] if names else int(v)): n for v, n in scan.values.items()})
        assert Counter(s.label for s in delivered) == by_index == +verified
    assert counted > 100 and refused > 100  # both verdicts were exercised
