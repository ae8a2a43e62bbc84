"""What keeps the code laid out by concern that import-linter's contracts cannot say (issue 51).

The import rules are contracts in pyproject.toml (``[tool.importlinter]``), checked by
``lint-imports`` (docs/layout.md lists them): the layers of cli/, loader/ and converter/ and of the
folders of each half, the format as the one contract between the halves, the converter apart from
torch, click, the loader and the CLI, and no import cycle, every import counted (deferred ones, and
those under ``if TYPE_CHECKING:``). :func:`test_the_contracts_hold` runs it. Here, the rest:

- One contract (issue 45): importing the loader loads none of the packer's modules (converter/'s
  ``__init__`` resolves its names when they are used: a run, not an import graph), and a pack stays
  byte for byte what it was.
- One word per meaning: no identifier with "stage" in it in ``epoch/``, ``state/`` or
  ``profiling/`` (a stage is a pipeline callable); no two loader modules whose names differ by
  one letter (``stream`` beside ``streams``).
- loader/'s top level at most 16 entries; every package's ``__init__`` says what it holds.
- A dataset is a spec and an epoch (issue 39): no ``NotImplementedError`` raised in loader/ (no
  base class with methods to fill in); no module but the dataset's own reads a dataset's private
  attribute.
- One table of image formats (issue 39): an image extension spelled as a string (``"png"``,
  ``".tiff"``, ``"JPEG"``...), the default ``"jpg"`` aside, in one module of converter/ (the table,
  ``converter/format/imageformats.py``) and one of loader/ at most.
- One place per storage protocol (issue 39): a scheme name (``"s3"``, ``"https://"``) is written in
  the protocol table, converter/format/protocols.py, and in at most one loader module besides; the rest
  reads the table.
- converter/ by stage (issue 45): no chain of imports inside converter/ longer than 8 modules
  (module-level and deferred imports; not those under ``if TYPE_CHECKING:``, which never run): a
  depth, which no contract measures.
- Tests mirror the code (issue 45): every module of converter/, loader/ and cli/ has its test file,
  ``tests/<folder>/<sub>/test_<module>.py``, or is listed in ``TESTED_BY`` with the test file that
  covers it (one that imports the module or names it); a listing of a module gone, or of one that
  has its own test file now, fails too.

Run as a script, it prints converter/'s longest import stack, each import with its line and kind::

    python tests/test_layout.py
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import inspect
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from itertools import combinations, pairwise
from pathlib import Path, PurePosixPath

import pytest

from imgshards.converter import PackConfig, pack

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"converter": "imgshards.converter", "loader": "imgshards.loader", "cli": "imgshards.cli"}
LOADER = "imgshards.loader"
ONE_MEANING = ("epoch", "state", "profiling")  # loader/ folders where "stage" names nothing
# The datasets a user imports (dataset, mix, imagefolder, and torchvision_datasets, the stand-in for
# torchvision.datasets) sit here, beside the loader.
MAX_TOP_LEVEL = 16


def _module_name(path: Path) -> str:
    folder, *rest = path.relative_to(ROOT).with_suffix("").parts
    parts = [FOLDERS[folder], *rest]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for f in FOLDERS for p in sorted((ROOT / f).rglob("*.py"))}


# ---- the contracts (issue 51) --------------------------------------------------------------------

# The names of the contracts in pyproject.toml, each a rule this file checked by hand before.
CONTRACTS = (
    "cli/ over loader/ over converter/",
    "converter/ by stage, each over the ones it imports",
    "loader/ by folder, each over the ones it imports",
    "the loader imports nothing of the converter but its format",
    "the loader reads the format and never writes it",
    "the converter imports no torch, no click, nothing of loader/ or cli/",
    "no import cycle",
)


def test_the_contracts_hold():
    # CI runs `lint-imports` itself; here so that `pytest` alone says when an import breaks a layer.
    linter = Path(sys.executable).with_name("lint-imports")
    if not linter.is_file():
        pytest.skip(
            "import-linter is not installed (pip install import-linter): lint-imports checks the layers"
        )
    done = subprocess.run(
        [str(linter), "--no-cache", "--no-logo", str(ROOT / "pyproject.toml")],
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "200"},  # a contract's name and KEPT on one line
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for name in CONTRACTS:  # each still there, under its name, and kept
        assert re.search(rf"^{re.escape(name)}\s*KEPT", done.stdout, re.M), (
            f"{name!r} not kept:\n{done.stdout}"
        )


# ---- one contract: the packed format (issue 45) --------------------------------------------------

CONVERTER = "imgshards.converter"
FORMAT = f"{CONVERTER}.format"


def _packer_modules_loaded(code: str) -> list[str]:
    """The converter's modules outside format/ that ``code`` leaves in sys.modules, in a fresh Python."""
    found = subprocess.run(
        [
            sys.executable,
            "-c",
            f"{code}\nimport sys\nprint('\\n'.join(m for m in sys.modules if m.startswith('{CONVERTER}.')))",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    return sorted(m for m in found if not (m == FORMAT or m.startswith(f"{FORMAT}.")))


@pytest.mark.parametrize(
    "code",
    [
        "import imgshards.loader\nfrom imgshards.loader import ImageFolder",
        "import imgshards.loader.imagefolder",
    ],
)
def test_the_loader_loads_no_packer_module(code):
    # The loader reads the format and nothing else of the converter: a change to packing cannot
    # break its import, nor slow it (converter/__init__ resolves its names when they are used).
    assert _packer_modules_loaded(code) == []


def test_the_check_of_loaded_modules_sees_the_packer():
    assert "imgshards.converter.pack" in _packer_modules_loaded("from imgshards.converter import pack")
    assert _packer_modules_loaded("import imgshards.converter.format.manifest") == []


def _digest_tree(root: Path) -> str:
    """One sha256 over a tree's relative names and the sha256 of each file's bytes."""
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(
            path.relative_to(root).as_posix().encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest()
        )
    return h.hexdigest()


# What `pack` wrote for tests/conftest.py's tiny_tree before the format moved to converter/format/
# (issue 45), keyed by the digest of the tree itself: its trees are cut from ../shared's photos when
# they are there, and are smooth random JPEGs otherwise (as in a user's clone and .ci/run's first run).
# The index's "source" (the tree's temporary path) reads "<source>". Index format 2 (issue 49) left
# the shards as they were: its index.json and table files are stored since.
PACK_DIGESTS = {
    # tree cut from ../shared's photos
    "3d41f4460b8da9c448d52ecda6c0b6e73f9aef2644d45e5d2d7d8293b0ddf994": {
        "index.json": "05d2b0dc2830bd198d5f677b7f61325b50dcb94406cb5a0ee556be18accc7549",
        "train-000000.tar": "ed46d86f4f7f9b91fb036efc66186fb68994c9a61356092ee81c87d502d86355",
        "train-000001.tar": "f23af83b8d205f16e75cec07e925a34f67df6cb189453b21bbf35b750616c228",
        "train-000002.tar": "5960a41713e1a05c0900e19801b9ff8220bbd897979d041d407589055be5bd51",
        "train-000003.tar": "3e1381847107ee0cbaa39649b8d685801d7ee94c1ae0c41e8edd88be3540fd50",
        "train.keys.u32": "1464a45566269370e5e73ebef6180301c4f183ffe6a618a17b7748339876e86a",
        "train.labels.u32": "5926eeabdc1275d8935c715b081ff048268aeaea6ff88ffef32bc47a0123beef",
        "train.sources.zlib": "fdda25b41f400a2f472512bd4afba27e4cb26edf195a6f33af67fe923f74cedb",
        "train.starts.u32": "b1e2fa7b360b632267ca35c365f91083babaddbce81d4d48390ec51ca417ab1f",
        "val-000000.tar": "79358f9923d4a87722aaff5d3cec057d82ffe12cc5545daeca51875dbf30b604",
        "val-000001.tar": "443bfd2a4adc2990eaa5dbab85adc390f4c1084465fd0bbe9b1af7e5f7e838d3",
        "val.keys.u32": "063bda9bca99ff453ce4eb96c2279c8df87b8d7a03f44ad3ca19b531100ed4e4",
        "val.labels.u32": "42de7f72c4bf3ac517fd57d8f266d216c8f49b195a5349999461d93a4e6f7809",
        "val.sources.zlib": "89d97b1097644e6dfc41db6fc1416785e5959ef5ca713c253c6eda4c7443b0b0",
        "val.starts.u32": "600f0fe4475e8015228280c28457be206a9bcff18024b1be715b1817a48da9fd",
    },
    # the fallback tree (no ../shared)
    "1078cf7200668db41285e12149f7e21d4325a3875e953d64b2bef33e36caf2c8": {
        "index.json": "b7707cc1403fff2c816c83480b11eac5abd9bdf7c51a5dd7c439f69d0dd2cb88",
        "train-000000.tar": "c88ddd57d8792928f2fe506ed397847fb7350d0460f1db9450229dec79376345",
        "train-000001.tar": "8bd8e8900c10ca5cf8c4647766b1bee4fc824af63306f846cd00dbd3174c0023",
        "train-000002.tar": "39e6e3f59fffcea5a037b263964a92b5093e96d3c58cb2ab56db769f2e95cde2",
        "train-000003.tar": "9053bc789ac73762b22b52fb7d977f7369211e6ef54dda3d43d83bb52f758590",
        "train.keys.u32": "1464a45566269370e5e73ebef6180301c4f183ffe6a618a17b7748339876e86a",
        "train.labels.u32": "5926eeabdc1275d8935c715b081ff048268aeaea6ff88ffef32bc47a0123beef",
        "train.sources.zlib": "2fd07fb1beb37eb1ce9608744fd3e6bc3b7dbc65955feb1a87deed1a696089a5",
        "train.starts.u32": "3f302299dedf80f6bf12120a5f248197c3f4c67959122ea1ee333f328dfeac38",
        "val-000000.tar": "c78cf87765a4eca8f2018d9592c6ecbc7df552c213f4393533fe8c6f0dc4dbf9",
        "val-000001.tar": "486cb6c231ebe5702431c9a81edc337f224aebed98ea31eb2ed13b189a624e2d",
        "val.keys.u32": "063bda9bca99ff453ce4eb96c2279c8df87b8d7a03f44ad3ca19b531100ed4e4",
        "val.labels.u32": "42de7f72c4bf3ac517fd57d8f266d216c8f49b195a5349999461d93a4e6f7809",
        "val.sources.zlib": "89d97b1097644e6dfc41db6fc1416785e5959ef5ca713c253c6eda4c7443b0b0",
        "val.starts.u32": "9a1ec2980afa6800f824a814743c2b83d6c13080ddfe294fe637ffa40a35fa86",
    },
}


def test_a_pack_is_byte_identical_to_the_stored_one(tiny_tree, tmp_path):
    # Moving the format is no change to it: the same tree packs to the same bytes, index and shards.
    stored = PACK_DIGESTS.get(_digest_tree(tiny_tree))
    if stored is None:
        # Pillow's JPEG encoder (another libjpeg-turbo) made other test images: the pack of those
        # was never stored.
        pytest.skip(f"no stored pack for this tree of tiny_tree (sha256 {_digest_tree(tiny_tree)})")
    dst = tmp_path / "packed"
    pack(tiny_tree, dst, PackConfig(workers=1, shard_size=32768, val_fraction=0.25))
    index = (dst / "index.json").read_bytes()
    source = json.dumps(str(tiny_tree))[1:-1].encode()
    assert source in index
    found = {"index.json": hashlib.sha256(index.replace(source, b"<source>")).hexdigest()}
    found |= {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(dst.glob("*.tar"))}
    # The table files, named by their content (<split>=<table>.<sha256[:16]>.<suffix>): stored by table.
    for path in sorted(p for p in dst.iterdir() if p.suffix in (".u32", ".zlib")):
        split, _, rest = path.name.partition("=")
        table, digest, suffix = rest.split(".")
        found[f"{split}.{table}.{suffix}"] = hashlib.sha256(path.read_bytes()).hexdigest()
        assert found[f"{split}.{table}.{suffix}"].startswith(digest), path.name
    assert found == stored


def _identifiers(tree: ast.AST) -> list[tuple[str, int]]:
    """(identifier, line) for every name the code binds or reads; not strings, not comments."""
    found: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            found.append((node.id, node.lineno))
        elif isinstance(node, ast.arg):
            found.append((node.arg, node.lineno))
        elif isinstance(node, ast.Attribute):
            found.append((node.attr, node.lineno))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.append((node.name, node.lineno))
        elif isinstance(node, ast.keyword) and node.arg:
            found.append((node.arg, node.lineno))
        elif isinstance(node, ast.alias):
            found += [(n, node.lineno) for n in (node.name, node.asname) if n]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.append((node.module, node.lineno))
    return found


def test_stage_means_one_thing():
    # A stage is a pipeline callable: resume legs, profiling steps and the counters of either have
    # names of their own.
    wrong = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for folder in ONE_MEANING
        for path in sorted((ROOT / "loader" / folder).rglob("*.py"))
        for name, line in sorted(
            set(_identifiers(ast.parse(path.read_text(), str(path)))), key=lambda n: (n[1], n[0])
        )
        if "stage" in name.lower()
    ]
    assert not wrong, f"'stage' in an identifier in loader/{{{','.join(ONE_MEANING)}}}/:\n" + "\n".join(wrong)


def _one_letter_apart(a: str, b: str) -> bool:
    """Edit distance exactly 1: one letter substituted, inserted or deleted."""
    if len(a) > len(b):
        a, b = b, a
    if len(b) - len(a) > 1 or a == b:
        return False
    if len(a) == len(b):
        return sum(x != y for x, y in zip(a, b, strict=True)) == 1
    return any(b[:i] + b[i + 1 :] == a for i in range(len(b)))


def _named_alike(a: str, b: str) -> bool:
    """One word twice: one letter apart (``stream``/``streams``), a plural in ``-es``, or a verb and its
    ``-er`` (``read``/``reader``, ``decode``/``decoder``)."""
    short, long = sorted((a, b), key=len)
    return _one_letter_apart(a, b) or long in (short + "es", short + "er", short + "r")


def test_no_two_loader_modules_named_alike():
    # `stream` (HTTP ranges) beside `streams` (CUDA streams), or `read` (a pass's runs) beside
    # `reader` (the tar reader), reads as one thing twice at a folder's edge (issue 39).
    loader = ROOT / "loader"
    names: dict[str, list[str]] = {}
    for path in sorted(loader.rglob("*")):
        if "__pycache__" in path.parts or path.name == "__init__.py":
            continue
        if path.suffix == ".py" or (path / "__init__.py").exists():
            names.setdefault(path.stem if path.suffix == ".py" else path.name, []).append(
                str(path.relative_to(ROOT))
            )
    wrong = [
        f"{', '.join(names[a])}  ~  {', '.join(names[b])}"
        for a, b in combinations(sorted(names), 2)
        if _named_alike(a, b)
    ]
    assert not wrong, "loader modules named as one word (singular/plural, verb/-er):\n" + "\n".join(wrong)


def test_one_letter_apart():
    assert _one_letter_apart("stream", "streams")
    assert _one_letter_apart("streams", "stream")
    assert _one_letter_apart("batch", "patch")
    assert _one_letter_apart("read", "bread")
    assert not _one_letter_apart("read", "reader")
    assert not _one_letter_apart("order", "order")


def test_named_alike():
    assert _named_alike("batch", "batches")
    assert _named_alike("reader", "read")
    assert _named_alike("decode", "decoder")
    assert _named_alike("stream", "streams")
    assert not _named_alike("runs", "tar")
    assert not _named_alike("decode", "decoding")  # a verb and its act: one concern, said two ways


def test_the_loader_top_level_stays_small():
    # Code only: the PEP 561 marker (py.typed) is no module.
    entries = sorted(e.name for e in (ROOT / "loader").iterdir() if e.name not in ("__pycache__", "py.typed"))
    assert len(entries) <= MAX_TOP_LEVEL, (
        f"loader/ has {len(entries)} top-level entries, at most {MAX_TOP_LEVEL}: {' '.join(entries)}"
    )


def test_every_package_says_what_it_holds():
    wrong = [
        str(init.relative_to(ROOT))
        for folder in FOLDERS
        for init in sorted((ROOT / folder).rglob("__init__.py"))
        if not ast.get_docstring(ast.parse(init.read_text()))
    ]
    assert not wrong, f"no docstring saying what the package holds: {', '.join(wrong)}"


def test_no_name_of_the_loader_masks_one_of_its_modules():
    # `imgshards.loader.image.decode` is the module; the function is `decode_image` (or `.decode.decode`).
    for init in (ROOT / "loader").rglob("__init__.py"):
        package = importlib.import_module(_module_name(init))
        for path in init.parent.iterdir():
            is_package = (path / "__init__.py").exists()
            name = path.stem if path.suffix == ".py" else path.name if is_package else None
            if name and name != "__init__" and name in vars(package):
                assert inspect.ismodule(vars(package)[name]), f"{package.__name__}.{name} masks its module"


def not_implemented_raised(tree: ast.AST) -> list[int]:
    """Lines raising ``NotImplementedError`` or subclassing it: a method left for a subclass to fill in."""

    def named(node: ast.expr | None) -> bool:
        if isinstance(node, ast.Call):
            node = node.func
        return isinstance(node, ast.Name) and node.id == "NotImplementedError"

    return sorted(
        node.lineno
        for node in ast.walk(tree)
        if (isinstance(node, ast.Raise) and named(node.exc))
        or (isinstance(node, ast.ClassDef) and any(named(base) for base in node.bases))
    )


def test_no_not_implemented_error_in_the_loader():
    # A dataset is a spec and an epoch (issue 39): no base class with methods to fill in. Catching a
    # library's NotImplementedError (fsspec's ls, in remote/source.py) is not filling anything in.
    wrong = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in sorted((ROOT / "loader").rglob("*.py"))
        for line in not_implemented_raised(ast.parse(path.read_text(), str(path)))
    ]
    assert not wrong, "NotImplementedError raised in loader/ (a method left to fill in):\n" + "\n".join(wrong)


def test_the_not_implemented_rule_finds_raises():
    code = """
class A:
    def f(self):
        raise NotImplementedError
    def g(self):
        raise NotImplementedError("fill me in")
class B(NotImplementedError):
    pass
try:
    pass
except NotImplementedError:
    pass
ok = isinstance(e, (OSError, NotImplementedError))
"""
    assert not_implemented_raised(ast.parse(code)) == [4, 6, 7]


# Read from outside by anyone: where the epoch is (ShardLoader, the trainers) and their settings.
SCANNED_FOR_PRIVATES = ("loader", "cli", "bench", "tests")


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def dataset_privates() -> tuple[set[str], set[Path]]:
    """The private names the dataset classes (and their bases in imgshards) define, and their modules."""
    from imgshards.loader import MixedDataset, ShardDataset

    names: set[str] = set()
    own: set[Path] = set()
    for cls in (ShardDataset, MixedDataset):
        for klass in cls.__mro__:
            if not klass.__module__.startswith("imgshards."):
                continue
            own.add(Path(inspect.getsourcefile(klass) or "").resolve())
            for node in ast.walk(ast.parse(inspect.getsource(klass))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    found = [node.name]
                elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    found = [node.target.id]  # a class-level annotation (`_control: SharedControl`)
                elif (
                    isinstance(node, ast.Attribute)
                    and isinstance(node.ctx, ast.Store)
                    and isinstance(node.value, ast.Name)
                    and node.value.id in ("self", "cls")
                ):
                    found = [node.attr]
                else:
                    found = []
                names.update(n for n in found if _is_private(n))
    return names, own


def private_reads(tree: ast.AST, names: set[str]) -> list[tuple[int, str]]:
    """(line, ``x._name``) of each attribute ``_name`` in ``names`` read on something but ``self``/``cls``."""
    return sorted(
        (node.lineno, ast.unparse(node))
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr in names
        and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
    )


def test_no_module_reads_a_dataset_private_attribute():
    # What a dataset holds (its spec, its epoch) is its own: ShardLoader, the trainers' glue, the
    # benchmarks and the tests go through its public attributes, so its insides can change (issue 39).
    names, own = dataset_privates()
    wrong = [
        f"{path.relative_to(ROOT)}:{line}: {expr}"
        for folder in SCANNED_FOR_PRIVATES
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path.resolve() not in own
        for line, expr in private_reads(ast.parse(path.read_text(), str(path)), names)
    ]
    assert not wrong, (
        f"a dataset's private attribute ({', '.join(sorted(names))}) read outside "
        f"{', '.join(sorted(str(p.relative_to(ROOT)) for p in own))}; add a public one:\n" + "\n".join(wrong)
    )


def test_the_private_rule_finds_reads():
    code = """
class D:
    def f(self, other):
        self._control.name
        return other._control, cls._spec
name = ds._control.name
ds._spec = None
loader.dataset._progress.at
x._unrelated
"""
    found = private_reads(ast.parse(code), {"_control", "_spec", "_progress"})
    assert found == [
        (5, "other._control"),
        (6, "ds._control"),
        (7, "ds._spec"),
        (8, "loader.dataset._progress"),
    ]


# Every spelling of an image extension: each format's name and suffixes in the table, and the
# formats pack knows only to refuse. Compared without the dot, in any case.
IMAGE_SPELLINGS = frozenset(
    {"jpg", "jpeg", "jpe", "jfif", "png", "webp", "bmp", "ppm", "pgm", "pbm", "pnm", "tif", "tiff"}
    | {"gif", "ico", "heic", "heif", "avif"}
)
DEFAULT_FORMAT = "jpg"  # the default format's name, spelled where a default is given
FORMAT_TABLE = ROOT / "converter" / "format" / "imageformats.py"


def extension_literals(path: Path) -> list[tuple[int, str]]:
    """(line, literal) of each string constant in ``path`` spelling an image extension but the default."""
    tree = ast.parse(path.read_text(), str(path))
    docs = _docstrings(tree)
    return sorted(
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docs
        and node.value != DEFAULT_FORMAT
        and node.value.lower().removeprefix(".") in IMAGE_SPELLINGS
    )


def format_offenders() -> list[str]:
    """Where image extensions are spelled outside the format table and one loader module reading it."""
    where: dict[str, dict[str, list[str]]] = {}  # spelling -> folder -> "path:line" places
    for folder, paths in (
        ("converter", (ROOT / "converter").rglob("*.py")),
        ("loader", (ROOT / "loader").rglob("*.py")),
    ):
        for path in sorted(paths):
            for line, literal in extension_literals(path):
                spelling = literal.lower().removeprefix(".")
                where.setdefault(spelling, {}).setdefault(folder, []).append(
                    f"{path.relative_to(ROOT)}:{line}: {literal!r}"
                )
    wrong = []
    for spelling, folders in sorted(where.items()):
        converter = {place.split(":")[0] for place in folders.get("converter", [])}
        loader = {place.split(":")[0] for place in folders.get("loader", [])}
        if converter - {str(FORMAT_TABLE.relative_to(ROOT))} or len(loader) > 1:
            wrong += [f"{spelling}: {place}" for places in folders.values() for place in places]
    return wrong


def test_image_formats_are_known_in_one_table():
    # Adding a format is one entry in converter/format/imageformats.py (docs/layout.md): a module that spells
    # an extension itself is a place that entry does not reach.
    wrong = format_offenders()
    assert not wrong, (
        "image extensions spelled outside converter/format/imageformats.py (read its table, FORMATS):\n"
        + "\n".join(wrong)
    )


def test_the_format_rule_finds_spellings(tmp_path, monkeypatch):
    (tmp_path / "converter" / "format").mkdir(parents=True)
    (tmp_path / "loader" / "image").mkdir(parents=True)
    (tmp_path / "converter" / "format" / "imageformats.py").write_text(
        'PNG = "png"\nTIFF = (".tif", ".tiff")\n'
    )
    (tmp_path / "converter" / "write.py").write_text(
        '"""Writes .png files: "png"."""\nDEFAULT = "jpg"\nX = 1\n"""png: documents X."""\n'
        'def f(im):\n    """A docstring naming png."""\n    return im.format == "JPEG"\n'
    )
    (tmp_path / "loader" / "image" / "decode.py").write_text('SLOW = frozenset({".TIF", "png"})\n')
    (tmp_path / "loader" / "scaled.py").write_text('def f(ext):\n    return ext == "jpg" or ext == "png"\n')
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    monkeypatch.setitem(globals(), "FORMAT_TABLE", tmp_path / "converter" / "format" / "imageformats.py")
    assert format_offenders() == [
        "jpeg: converter/write.py:7: 'JPEG'",  # Pillow's name of it counts: the table holds it
        "png: converter/format/imageformats.py:1: 'png'",
        "png: loader/image/decode.py:1: 'png'",  # a second loader module spells it
        "png: loader/scaled.py:2: 'png'",
    ]


# ---- converter/ by stage (issue 45): no import stack deeper than 8 modules ---------------------
#
# A depth of the import graph, which no contract measures: read here with ``ast``, as Python runs
# the imports (a package's ``__init__`` before its modules).


@dataclass(frozen=True)
class Import:
    """One import statement's dependency of ``source`` on ``target``."""

    source: str
    target: str
    path: Path
    line: int
    kind: str  # "module level", "deferred" (run when a function is called) or "TYPE_CHECKING"

    def __str__(self) -> str:
        return f"{self.source} -> {self.target}  ({self.path.relative_to(ROOT)}:{self.line}, {self.kind})"


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


class _Imports(ast.NodeVisitor):
    """Every import of one module, with the kind of place it sits in."""

    def __init__(self) -> None:
        self.found: list[tuple[ast.Import | ast.ImportFrom, str]] = []
        self.kind = "module level"

    def _within(self, kind: str, nodes: list[ast.stmt]) -> None:
        # The outermost place names the kind: a function under TYPE_CHECKING is TYPE_CHECKING, an
        # `if TYPE_CHECKING:` in a function deferred.
        outer = self.kind
        if outer == "module level":
            self.kind = kind
        for node in nodes:
            self.visit(node)
        self.kind = outer

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self._within("deferred", node.body)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node.test):
            self._within("TYPE_CHECKING", node.body)
            self._within(self.kind, node.orelse)
        else:
            self.generic_visit(node)

    def visit_Import(self, node: ast.Import | ast.ImportFrom) -> None:
        self.found.append((node, self.kind))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        self.visit_Import(node)


def _targets(
    node: ast.Import | ast.ImportFrom, name: str, is_package: bool, modules: dict[str, Path]
) -> set[str]:
    """The imgshards modules an import runs, seen from module ``name``.

    ``import a.b.c`` and ``from a.b.c import x`` run ``a``, ``a.b`` and ``a.b.c`` (each package's
    ``__init__``), and ``a.b.c.x`` too where ``x`` is a module. The importer's own packages are left
    out (they are loading already), except a package a name is read from: ``from . import x`` where
    ``x`` is a module depends on ``x`` alone, ``from . import f`` on the package's ``__init__``.
    """
    if isinstance(node, ast.Import):
        dotted = [a.name for a in node.names]
        named: list[str] = []
    else:
        package = name if is_package else name.rpartition(".")[0]
        base = package
        for _ in range(node.level - 1):
            base = base.rpartition(".")[0]
        base = (f"{base}.{node.module}" if node.module else base) if node.level else (node.module or "")
        dotted = [base]
        named = [f"{base}.{a.name}" for a in node.names]
    ancestors = {name.rsplit(".", n)[0] for n in range(name.count(".") + 1)}
    found = set()
    for full in dotted:
        parts = full.split(".")
        found |= {".".join(parts[:n]) for n in range(1, len(parts) + 1)} - ancestors
    for full in named:
        found.add(full if full in modules else full.rpartition(".")[0])
    return {t for t in found if t in modules and t != name}


def _imports() -> list[Import]:
    """Every import between imgshards modules, wherever it sits in the importing module."""
    modules = _modules()
    found = []
    for name, path in modules.items():
        visitor = _Imports()
        visitor.visit(ast.parse(path.read_text(), str(path)))
        for node, kind in visitor.found:
            for target in sorted(_targets(node, name, path.name == "__init__.py", modules)):
                found.append(Import(name, target, path, node.lineno, kind))
    return found


def _import_graph(imports: list[Import] | None = None) -> dict[str, set[str]]:
    """Module -> imgshards modules it imports, every import counted."""
    graph: dict[str, set[str]] = {name: set() for name in _modules()}
    for i in _imports() if imports is None else imports:
        graph[i.source].add(i.target)
    return graph


MAX_STACK = 8


def _stacks(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    """For each module, the longest chain of imports it starts (itself first), one per module.

    The graph has no cycle (the contract "no import cycle", lint-imports); one fails here, named.
    """
    longest: dict[str, list[str]] = {}
    path: list[str] = []

    def visit(node: str) -> list[str]:
        if node in path:
            raise AssertionError(
                "an import cycle (lint-imports): " + " -> ".join([*path[path.index(node) :], node])
            )
        if node not in longest:
            path.append(node)
            longest[node] = max(([node, *visit(t)] for t in sorted(graph[node])), key=len, default=[node])
            path.pop()
        return longest[node]

    for node in sorted(graph):
        visit(node)
    return longest


def converter_stack() -> list[str]:
    """The longest chain of imports inside converter/ that loading one of its modules runs.

    Counted: module-level imports and deferred ones (in a function: they run when it is called;
    converter/ has one, the engine's of Ray); a package's ``__init__`` is a module of the chain. Not
    counted: those under ``if TYPE_CHECKING:``, which never run (annotations only).
    """
    imports = [
        i
        for i in _imports()
        if i.kind != "TYPE_CHECKING" and i.source.startswith(CONVERTER) and i.target.startswith(CONVERTER)
    ]
    graph = {m: set() for m in _modules() if m.startswith(CONVERTER)}
    for i in imports:
        graph[i.source].add(i.target)
    return max(_stacks(graph).values(), key=len)


def test_no_converter_import_stack_deeper_than_8():
    # A module stacked 15 imports deep cannot be read without the 14 under it (issue 45): each stage
    # of the pack (scan, plan, write, engines, remote, shards) is a short stack of its own.
    stack = converter_stack()
    shown = " -> ".join(m.removeprefix(f"{CONVERTER}.") for m in stack)
    assert len(stack) <= MAX_STACK, f"an import stack {len(stack)} modules deep in converter/: {shown}"


def test_the_stack_measure_counts_the_longest_chain():
    assert _stacks({"a": {"b", "c"}, "b": {"c"}, "c": set()})["a"] == ["a", "b", "c"]
    assert _stacks({"a": set()}) == {"a": ["a"]}

    with pytest.raises(AssertionError, match="a -> b -> a"):
        _stacks({"a": {"b"}, "b": {"a"}})


def _graph_of(files: dict[str, str], tmp_path: Path, monkeypatch) -> dict[str, set[str]]:
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    return {
        k.removeprefix(f"{LOADER}."): {t.removeprefix(f"{LOADER}.") for t in v}
        for k, v in _import_graph().items()
    }


def test_the_import_reader_reads_every_form(tmp_path, monkeypatch):
    graph = _graph_of(
        {
            "loader/__init__.py": "from .dataset import ShardDataset\n",
            "loader/dataset.py": "from .pipeline import passes\n",
            "loader/stages.py": "def f():\n    from .dataset import ShardDataset\n",
            "loader/pipeline/__init__.py": "",
            "loader/pipeline/passes.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..decode import decode\n"
                "from . import runs\nfrom .. import stages\n"
            ),
            "loader/pipeline/runs.py": "import imgshards.loader.epoch.order\nfrom . import helper\n",
            "loader/epoch/__init__.py": "",
            "loader/epoch/order.py": "",
            "loader/decode.py": "",
        },
        tmp_path,
        monkeypatch,
    )
    # The stack counts module-level and deferred imports; lint-imports' graph (grimp's) those too.
    assert graph == {
        "imgshards.loader": {"dataset"},
        "dataset": {"pipeline", "pipeline.passes"},  # `from .pkg import mod`: the package, the module
        "stages": {"dataset"},  # deferred
        "pipeline": set(),
        "pipeline.passes": {"decode", "pipeline.runs", "stages"},  # TYPE_CHECKING; own package left out
        "pipeline.runs": {"epoch", "epoch.order", "pipeline"},  # `helper` is no module: a name of pipeline
        "epoch": set(),
        "epoch.order": set(),
        "decode": set(),
    }
    kinds = {
        (i.source.removeprefix(f"{LOADER}."), i.target.removeprefix(f"{LOADER}.")): i.kind for i in _imports()
    }
    assert kinds[("stages", "dataset")] == "deferred"
    assert kinds[("pipeline.passes", "decode")] == "TYPE_CHECKING"
    assert kinds[("pipeline.passes", "pipeline.runs")] == "module level"


def describe_stack(stack: list[str]) -> str:
    """A stack, each import in it with its line and kind."""
    imports = _imports()
    found = [" -> ".join(m.removeprefix(f"{CONVERTER}.") for m in stack)]
    for source, target in pairwise(stack):
        found += [f"    {i}" for i in imports if (i.source, i.target) == (source, target)]
    return "\n".join(found)


# ---- one table of storage protocols (issue 39) ---------------------------------------------------


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring nodes of ``tree``: a module's, a class's, a function's, an attribute's."""
    found = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        for i, stmt in enumerate(body):
            # The first statement, or a string right after an assignment (an attribute's docstring).
            after_assign = i > 0 and isinstance(body[i - 1], (ast.Assign, ast.AnnAssign))
            if (
                (i == 0 or after_assign)
                and isinstance(stmt, ast.Expr)
                and isinstance(stmt.value, ast.Constant)
                and isinstance(stmt.value.value, str)
            ):
                found.add(id(stmt.value))
    return found


_PREFIX_METHODS = frozenset({"startswith", "endswith", "removeprefix", "partition", "split", "find", "index"})


def scheme_constants(tree: ast.AST, schemes: frozenset[str]) -> list[tuple[str, int]]:
    """(constant, line) for each string in ``tree`` that names a storage protocol, docstrings not counted.

    A ``scheme://`` prefix (alone, or starting a longer string) always does; a bare scheme name (in
    lower case, as code writes one) where it is used as one: compared (``==``, ``in``), listed (a
    tuple, list or set literal), a key of a dict whose keys are all scheme names (a dispatch table),
    a ``case`` pattern, or the argument of ``startswith`` and the like. A bare word elsewhere (a JSON
    key ``"file"``, ``plural(n, "file")``) is not a scheme.
    """
    parents = {id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    skip = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) or id(node) in skip:
            continue
        text = node.value.lower()
        head, sep, _ = text.partition("://")
        if sep and head in schemes:
            found.append((node.value, node.lineno))
            continue
        if node.value not in schemes:  # a bare name as code writes it ("Memory" is a word)
            continue
        parent = parents.get(id(node))
        if isinstance(parent, (ast.Tuple, ast.List, ast.Set)):
            parent = parents.get(id(parent))  # ("http", "https") in a comparison or a call: listed
            listed = True
        else:
            listed = False
        used = (
            listed
            or isinstance(parent, (ast.Compare, ast.MatchValue))
            or (
                isinstance(parent, ast.Dict)
                and any(k is node for k in parent.keys)
                and all(isinstance(k, ast.Constant) and str(k.value).lower() in schemes for k in parent.keys)
            )
            or (
                isinstance(parent, ast.Call)
                and isinstance(parent.func, ast.Attribute)
                and parent.func.attr in _PREFIX_METHODS
            )
        )
        if used:
            found.append((node.value, node.lineno))
    return found


def test_scheme_constants_finds_schemes_used_as_such():
    schemes = frozenset({"s3", "http", "https", "file"})
    code = """
\"\"\"A docstring: s3 and http://host are not counted.\"\"\"
if protocol == "s3":
    pass
if p in ("http", "https"):
    pass
ok = url.startswith("HTTP://")
dispatch = {"s3": 1, "file": 2}
where = f"s3://{bucket}"
match p:
    case "file":
        pass
record = {"total": 1, "file": "rejects.txt"}
name = record["file"]
again = record.get("file")
shown = plural(n, "file")
"""
    found = scheme_constants(ast.parse(code), schemes)
    assert sorted(found, key=lambda f: (f[1], f[0])) == [
        ("s3", 3),
        ("http", 5),
        ("https", 5),
        ("HTTP://", 7),
        ("file", 8),
        ("s3", 8),
        ("s3://", 9),
        ("file", 11),
    ]


def test_each_storage_protocol_is_named_in_one_place():
    # A storage protocol's schemes, timeouts, version check and error hints are one entry of
    # converter/format/protocols.py; the converter and the loader read that table, and no if-chain on a
    # scheme name grows elsewhere. Allowed: the table, plus one module of loader/ (its reader).
    from imgshards.converter.format.protocols import SCHEMES

    where: dict[str, dict[str, list[str]]] = {}  # scheme -> module -> "path:line: 'constant'"
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for value, line in scheme_constants(ast.parse(path.read_text(), str(path)), SCHEMES):
                name = value.lower().partition("://")[0]
                module = str(path.relative_to(ROOT))
                where.setdefault(name, {}).setdefault(module, []).append(f"{module}:{line}: {value!r}")
    wrong = []
    for name, modules in sorted(where.items()):
        per_folder = {f: [m for m in modules if m.startswith(f"{f}/")] for f in FOLDERS}
        if len(per_folder["converter"]) > 1 or len(per_folder["loader"]) > 1 or per_folder["cli"]:
            wrong += [f"{name}:"] + [f"    {hit}" for m in sorted(modules) for hit in modules[m]]
    assert not wrong, (
        "a storage protocol named outside its table (converter/format/protocols.py) and one reader in "
        "loader/; read the table instead:\n" + "\n".join(wrong)
    )


# ---- tests mirror the code (issue 45) -----------------------------------------------------------

# The modules of converter/, loader/ and cli/ without a test file of their own, each with the test
# file that covers it: that file imports the module (by its name, or a name the module defines) or
# names it (``loader/pipeline/steps.py``, ``imgshards.loader.pipeline.steps``; a ``__main__`` by
# ``-m imgshards.cli``). A module given a test file of its own leaves this list.
TESTED_BY = {
    "cli/__main__.py": "tests/converter/shards/test_verify.py",
    "cli/exits.py": "tests/cli/test_errors.py",
    "cli/index.py": "tests/converter/shards/test_index.py",
    "cli/info.py": "tests/cli/test_cli.py",
    "cli/main.py": "tests/cli/test_cli.py",
    "cli/options.py": "tests/cli/test_cli.py",
    "cli/pack.py": "tests/cli/test_conventions.py",
    "cli/storage.py": "tests/converter/remote/test_upload.py",
    "cli/verify.py": "tests/converter/shards/test_verify.py",
    "converter/config.py": "tests/converter/test_pack.py",
    "converter/engines/engine.py": "tests/converter/engines/test_rayengine.py",
    "converter/engines/pool.py": "tests/converter/test_pack_untrusted.py",
    "converter/format/errors.py": "tests/converter/test_source_faults.py",
    "converter/format/imagesizes.py": "tests/converter/plan/test_resizehint.py",
    "converter/format/labels.py": "tests/test_tar_verdict.py",
    "converter/format/locate.py": "tests/converter/format/test_protocols.py",
    "converter/format/manifest.py": "tests/converter/format/test_validate.py",
    "converter/format/remotefs.py": "tests/converter/format/test_protocols.py",
    "converter/format/tables.py": "tests/loader/pipeline/test_offsets.py",
    "converter/format/tarsamples.py": "tests/test_tar_verdict.py",
    "converter/format/tarstream.py": "tests/test_tar_verdict.py",
    "converter/plan/dryrun.py": "tests/cli/test_conventions.py",
    "converter/plan/shards.py": "tests/converter/test_pack.py",
    "converter/plan/tasks.py": "tests/converter/engines/test_rayengine.py",
    "converter/scan/reasons.py": "tests/converter/scan/test_check.py",
    "converter/scan/sourcefiles.py": "tests/converter/test_source_faults.py",
    "converter/shards/read.py": "tests/test_tar_verdict.py",
    "converter/synthetic.py": "tests/cli/test_errors.py",
    "converter/write/attempts.py": "tests/converter/engines/test_rayengine.py",
    "converter/write/destination.py": "tests/converter/write/test_safefs.py",
    "converter/write/failures.py": "tests/converter/test_source_faults.py",
    "converter/write/indexurl.py": "tests/converter/shards/test_index.py",
    "converter/write/shard.py": "tests/converter/test_source_faults.py",
    "loader/dataloader.py": "tests/loader/test_dataset.py",
    "loader/device/backends.py": "tests/loader/device/test_device_defects.py",
    "loader/device/marks.py": "tests/loader/device/test_decoding.py",
    "loader/device/memory.py": "tests/loader/device/test_device_defects.py",
    "loader/device/streams.py": "tests/loader/device/test_device_cuda.py",
    "loader/epoch/position.py": "tests/loader/pipeline/test_passes.py",
    "loader/epoch/seeds.py": "tests/loader/epoch/test_order.py",
    "loader/errors.py": "tests/loader/test_dataset.py",
    "loader/image/pil_input.py": "tests/loader/test_pytorch_habits.py",
    "loader/pipeline/batches.py": "tests/loader/test_stages.py",
    "loader/pipeline/offload.py": "tests/loader/device/test_device_defects.py",
    "loader/pipeline/settings.py": "tests/loader/test_settings.py",
    "loader/pipeline/steps.py": "tests/loader/profiling/test_profiling.py",
    "loader/profiling/config.py": "tests/loader/profiling/test_profiling.py",
    "loader/profiling/devicerun.py": "tests/cli/test_bench.py",
    "loader/profiling/procstats.py": "tests/loader/profiling/test_profiling.py",
    "loader/profiling/report.py": "tests/loader/profiling/test_profiling.py",
    "loader/profiling/runner.py": "tests/loader/profiling/test_profiling.py",
    "loader/state/cursor.py": "tests/loader/test_pytorch_habits.py",
    "loader/state/progress.py": "tests/loader/test_lost_threshold.py",
}


def mirrored_test(module: str) -> str:
    """The test file of ``module`` (``loader/pipeline/spec.py`` -> ``tests/loader/pipeline/test_spec.py``)."""
    path = PurePosixPath(module)
    return (PurePosixPath("tests") / path.parent / f"test_{path.name}").as_posix()


def _dotted(module: str) -> str:
    folder, *rest = PurePosixPath(module).with_suffix("").parts
    return ".".join([FOLDERS[folder], *rest])


def _defined_in(module: str, name: str) -> str | None:
    """The module that defines ``module.name``, where it is a module, a class or a function."""
    try:
        value = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None
    if inspect.ismodule(value):
        return value.__name__
    return value.__module__ if inspect.isclass(value) or inspect.isfunction(value) else None


def imported_modules(tree: ast.AST) -> set[str]:
    """The modules a test file imports, wherever the import sits.

    ``import imgshards.a.b``, ``from imgshards.a.b import x`` and ``from imgshards.a import b`` import
    ``imgshards.a.b``; ``from imgshards.loader import ShardLoader`` imports the module that defines
    ``ShardLoader``, ``from imgshards.loader import elastic`` the module a package holds under that
    name. Relative imports (the tests' own helpers) are not counted.
    """
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
            if node.module.partition(".")[0] == "imgshards":
                found |= {m for a in node.names if (m := _defined_in(node.module, a.name))}
    return found


def covers(test: Path, module: str) -> bool:
    """Whether ``test`` imports ``module`` (a path from the root) or names it, by its path or its name."""
    source = test.read_text()
    dotted = _dotted(module)
    named = [rf"(?<![\w./]){re.escape(module)}(?!\w)", rf"(?<![\w.]){re.escape(dotted)}(?!\w)"]
    if PurePosixPath(module).stem == "__main__":  # what `python -m imgshards.cli` runs
        named.append(rf"-m[\s\"',]+{re.escape(dotted.removesuffix('.__main__'))}(?![\w.])")
    return dotted in imported_modules(ast.parse(source, str(test))) or any(
        re.search(pattern, source) for pattern in named
    )


def mirror_offenders() -> list[str]:
    """Modules with neither a test file of their own nor a listing in TESTED_BY that holds; stale listings."""
    modules = sorted(
        p.relative_to(ROOT).as_posix()
        for folder in FOLDERS
        for p in (ROOT / folder).rglob("*.py")
        if p.name != "__init__.py"
    )
    wrong = []
    for module in modules:
        mirror, listed = mirrored_test(module), TESTED_BY.get(module)
        if (ROOT / mirror).is_file():
            if listed is not None:
                wrong.append(f"{module}: {mirror} is its test now; take it out of TESTED_BY")
        elif listed is None:
            wrong.append(f"{module}: no {mirror}, and not in TESTED_BY")
        elif not (listed.startswith("tests/") and PurePosixPath(listed).name.startswith("test_")):
            wrong.append(f"{module}: TESTED_BY names {listed}, not a test file under tests/")
        elif listed == "tests/test_layout.py":
            wrong.append(f"{module}: TESTED_BY names tests/test_layout.py, which names every module it lists")
        elif not (ROOT / listed).is_file():
            wrong.append(f"{module}: TESTED_BY names {listed}, which does not exist")
        elif not covers(ROOT / listed, module):
            wrong.append(f"{module}: {listed} (TESTED_BY) neither imports nor names it")
    wrong += [
        f"{module}: in TESTED_BY, but there is no such module"
        for module in sorted(TESTED_BY.keys() - set(modules))
    ]
    return wrong


def test_every_module_has_its_test():
    # A module's test is found by its name (issue 45): tests/ mirrors converter/, loader/ and cli/,
    # and a module tested elsewhere says where, in TESTED_BY.
    wrong = mirror_offenders()
    assert not wrong, (
        "a module without its test file (tests/<folder>/<sub>/test_<module>.py) or a listing in "
        "TESTED_BY (tests/test_layout.py) naming the test that covers it:\n" + "\n".join(wrong)
    )


def test_the_mirror_rule_names_offenders(tmp_path, monkeypatch):
    files = {
        "loader/__init__.py": "",
        "loader/epoch/order.py": "",  # its own test: fine
        "loader/epoch/seeds.py": "",  # listed, and the test imports it: fine
        "loader/pipeline/steps.py": "",  # listed, and the test names it: fine
        "loader/pipeline/spec.py": "",  # neither its own test nor listed
        "loader/state/cursor.py": "",  # listed, but it has its own test now
        "loader/state/ranks.py": "",  # listed to a test that neither imports nor names it
        "cli/__main__.py": "",  # listed, and the test runs `python -m imgshards.cli`: fine
        "cli/info.py": "",  # listed to a test that does not exist
        "cli/options.py": "",  # listed to a file that is no test
        "converter/pack.py": "",  # listed to this file
        "tests/loader/epoch/test_order.py": "from imgshards.loader.epoch import seeds\n",
        "tests/loader/state/test_cursor.py": "",
        "tests/loader/test_clock.py": '"""Times loader/pipeline/steps.py."""\nimport imgshards.loader\n',
        "tests/cli/test_verify.py": 'run([sys.executable, "-m", "imgshards.cli", "verify"])\n',
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    monkeypatch.setitem(
        globals(),
        "TESTED_BY",
        {
            "loader/epoch/seeds.py": "tests/loader/epoch/test_order.py",
            "loader/pipeline/steps.py": "tests/loader/test_clock.py",
            "loader/state/cursor.py": "tests/loader/test_clock.py",
            "loader/state/ranks.py": "tests/loader/test_clock.py",
            "loader/epoch/gone.py": "tests/loader/epoch/test_order.py",
            "cli/__main__.py": "tests/cli/test_verify.py",
            "cli/info.py": "tests/cli/test_info_and_more.py",
            "cli/options.py": "tests/conftest.py",
            "converter/pack.py": "tests/test_layout.py",
        },
    )
    assert mirror_offenders() == [
        "cli/info.py: TESTED_BY names tests/cli/test_info_and_more.py, which does not exist",
        "cli/options.py: TESTED_BY names tests/conftest.py, not a test file under tests/",
        "converter/pack.py: TESTED_BY names tests/test_layout.py, which names every module it lists",
        "loader/pipeline/spec.py: no tests/loader/pipeline/test_spec.py, and not in TESTED_BY",
        "loader/state/cursor.py: tests/loader/state/test_cursor.py is its test now; take it out of TESTED_BY",
        "loader/state/ranks.py: tests/loader/test_clock.py (TESTED_BY) neither imports nor names it",
        "loader/epoch/gone.py: in TESTED_BY, but there is no such module",
    ]


def test_imported_modules_reads_every_form():
    from imgshards.loader import ShardLoader

    code = """
import imgshards.loader.epoch.order
from imgshards.loader.state.cursor import MAX_EPOCH
from imgshards.loader.pipeline import steps
from imgshards.loader import ShardLoader
from imgshards.loader.epoch import elastic
from .conftest import run
def f():
    import imgshards.cli.main as main
"""
    found = imported_modules(ast.parse(code))
    assert {
        "imgshards.loader.epoch.order",
        "imgshards.loader.state.cursor",
        "imgshards.loader.pipeline.steps",
        ShardLoader.__module__,  # a name: the module that defines it
        "imgshards.loader.epoch.elastic",  # a module the package holds under a name of its own
        "imgshards.cli.main",  # in a function too
    } <= found
    assert not any(m.endswith("conftest") or m == "run" for m in found)  # the tests' own helpers


if __name__ == "__main__":
    stack = converter_stack()
    print(f"converter/'s longest import stack, {len(stack)} modules:\n{describe_stack(stack)}")
    print("the import contracts: lint-imports (pyproject.toml, [tool.importlinter])")
    sys.exit(1 if len(stack) > MAX_STACK else 0)
