"""Every fenced code block of README.md and docs/*.md runs, or says why it cannot.

The convention (stated for writers in docs/README.md):

- a ```bash block runs with ``bash -e``, a ```python block with this environment's ``python``, each as
  a script of its own, saved to a file as a user saves it (``python block.py``: ``__file__`` set, no
  ``__main__`` guard added; a python block defines every name it uses: it runs as pasted);
- the blocks of one page run in order, in one fresh temporary directory (their cwd), which starts
  holding ``photos/``: a small ImageFolder tree, ``photos/train/<class>/*.jpg`` and
  ``photos/val/<class>/*.jpg``. A block makes what it needs (``imgshards pack photos/train shards``);
- ```text, ```console (and ```json, ```toml) blocks are output or reference: not run;
- ``<!-- no-test: the reason -->`` on the line just before a fence skips that block, and the reason
  is the pytest skip reason. A block that needs a network, a GPU, the checkout's ``../shared`` or
  minutes of measuring carries one; so do the README's install and test commands, which would run
  the suite inside itself (``.ci/run`` runs them).
"""

from __future__ import annotations

import io
import os
import random
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

RUN = {"bash", "python"}
NOT_RUN = {"text", "console", "json", "toml"}
BLOCK_TIMEOUT_S = 240
PHOTOS = {"train": 12, "val": 4}  # JPEGs per class
CLASSES = ["cat", "dog", "fox"]

NO_TEST = re.compile(r"^<!--\s*no-test:\s*(?P<reason>.*?)\s*-->\s*$")
FENCE = re.compile(r"^```(?P<lang>[\w+-]*)\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced block of a page: its language, first line (1-based, the fence), code and skip reason."""

    page: Path
    lang: str
    line: int
    code: str
    no_test: str | None

    @property
    def where(self) -> str:
        page = self.page.relative_to(ROOT).as_posix() if self.page.is_relative_to(ROOT) else self.page
        return f"{page}:{self.line}"


def extract_blocks(page: Path) -> list[Block]:
    """The fenced blocks of ``page``, in order; raises ``ValueError`` on an unclosed or unlabelled fence."""
    lines = page.read_text().splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            if lines[i].lstrip().startswith("```"):
                raise ValueError(f"{page.name}:{i + 1}: an indented or unparsed fence {lines[i]!r}")
            i += 1
            continue
        lang = fence["lang"]
        if not lang:
            raise ValueError(f"{page.name}:{i + 1}: a fence without a language: say ```text, ```bash ...")
        marker = NO_TEST.match(lines[i - 1]) if i else None
        if marker and not marker["reason"]:
            raise ValueError(f"{page.name}:{i}: a no-test marker without a reason")
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
        if end is None or lines[end].strip() != "```":
            raise ValueError(f"{page.name}:{i + 1}: the ```{lang} block is not closed by a bare ```")
        code = "\n".join(lines[i + 1 : end]) + "\n"
        blocks.append(Block(page, lang, i + 1, code, marker["reason"] if marker else None))
        i = end + 1
    return blocks


def make_photos(root: Path) -> Path:
    """``root/photos``: ``train`` and ``val`` splits of ``CLASSES``, smooth random 96x72 JPEGs."""
    photos = root / "photos"
    for split, per_class in PHOTOS.items():
        for cls in CLASSES:
            folder = photos / split / cls
            folder.mkdir(parents=True)
            rng = random.Random(f"{split}/{cls}")
            for i in range(per_class):
                im = Image.frombytes("RGB", (8, 6), rng.randbytes(8 * 6 * 3)).resize((96, 72), Image.BICUBIC)
                buf = io.BytesIO()
                im.save(buf, format="JPEG", quality=80)
                (folder / f"{cls}_{i:03d}.jpg").write_bytes(buf.getvalue())
    return photos


def run_block(block: Block, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run ``block`` in ``cwd`` with this environment's ``bash -e`` or ``python``; return the process."""
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "MPLBACKEND": "Agg"}
    env.pop("PYTHONPATH", None)
    if block.lang == "bash":
        cmd = ["bash", "-e", "-c", block.code, block.where]
    elif block.lang == "python":
        # As a user saves it: a worker started by spawn or a forkserver would run the file again.
        script = cwd / f"{block.page.stem}_{block.line}.py"
        script.write_text(block.code)
        cmd = [sys.executable, script.name]
    else:
        raise ValueError(f"{block.where}: a ```{block.lang} block is not run")
    return subprocess.run(
        cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S, check=False
    )


def check_block(block: Block, cwd: Path) -> None:
    """Run ``block``; ``pytest.fail`` with its code and output when it exits non-zero."""
    done = run_block(block, cwd)
    if done.returncode != 0:
        pytest.fail(
            f"{block.where}: the ```{block.lang} block exited {done.returncode}\n"
            f"--- block ---\n{block.code}--- stdout ---\n{done.stdout[-4000:]}\n"
            f"--- stderr ---\n{done.stderr[-6000:]}",
            pytrace=False,
        )


def _runnable() -> list[Block]:
    return [b for page in PAGES for b in extract_blocks(page) if b.lang in RUN]


@pytest.fixture(scope="module")
def photos_template(tmp_path_factory) -> Path:
    return make_photos(tmp_path_factory.mktemp("photos-template"))


@pytest.fixture(scope="module")
def page_dirs(tmp_path_factory, photos_template):
    """One fresh directory per page, holding a copy of ``photos/``, made on the page's first block."""
    dirs: dict[Path, Path] = {}
    failed: dict[Path, str] = {}

    def get(page: Path) -> tuple[Path, dict[Path, str]]:
        if page not in dirs:
            dirs[page] = tmp_path_factory.mktemp(page.stem)
            shutil.copytree(photos_template, dirs[page] / "photos")
        return dirs[page], failed

    return get


@pytest.mark.parametrize("block", _runnable(), ids=lambda b: f"{b.where}-{b.lang}")
def test_block_runs(block: Block, page_dirs):
    if block.no_test:
        pytest.skip(f"{block.where}: no-test: {block.no_test}")
    cwd, failed = page_dirs(block.page)
    if block.page in failed:
        pytest.skip(f"{block.where}: not run: the block at {failed[block.page]} of this page failed")
    try:
        check_block(block, cwd)
    except BaseException:
        failed[block.page] = block.where
        raise


def test_the_readme_loop_runs_as_a_file_inside_tqdm(tmp_path):
    # tqdm's monitor thread runs while the val loader's workers start.
    blocks = extract_blocks(ROOT / "README.md")
    loop = next(b for b in blocks if b.lang == "python" and "for batch in loader:" in b.code)
    # The block that packs what the loop reads (root = "shards"), however many pack blocks come first.
    pack = next(b for b in blocks if b.lang == "bash" and re.search(r"imgshards pack \S+ shards\b", b.code))
    code = "from tqdm import tqdm\n" + loop.code.replace("for batch in loader:", "for batch in tqdm(loader):")
    make_photos(tmp_path)
    check_block(pack, tmp_path)
    check_block(Block(loop.page, "python", loop.line, code, None), tmp_path)


# ---- the runner itself -----------------------------------------------------------------------------


def test_every_page_parses_and_there_are_blocks_to_run():
    # A moved folder or a renamed language must not turn the tests above into zero tests that pass.
    assert (ROOT / "README.md") in PAGES and len(PAGES) > 1
    runnable = _runnable()
    assert sum(1 for b in runnable if not b.no_test) >= 10
    every = [b for page in PAGES for b in extract_blocks(page)]
    unknown = [f"{b.where} ```{b.lang}" for b in every if b.lang not in RUN | NOT_RUN]
    assert not unknown, f"blocks neither run ({sorted(RUN)}) nor output ({sorted(NOT_RUN)}): {unknown}"


def test_the_readme_set_up_commands_are_marked_no_test():
    # They install the package and run the suite: inside the suite they would recurse. CI runs them.
    setup = [b for b in extract_blocks(ROOT / "README.md") if "pytest" in b.code or "pip install" in b.code]
    assert setup and all(b.no_test for b in setup)


def test_a_broken_block_fails_and_a_marked_one_is_skipped(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "Text.\n\n```bash\nmkdir made && ls photos/train\n```\n\n"
        "```python\nfrom pathlib import Path\nassert Path('made').is_dir()\n```\n\n"
        "```bash\nls nowhere\necho 'reached only without -e'\n```\n\n"
        "```python\nimport imgshards.loader\nimgshards.loader.no_such_name\n```\n\n"
        "<!-- no-test: needs a GPU -->\n```python\nraise SystemExit(1)\n```\n\n"
        "```text\n$ output, not run\n```\n"
    )
    blocks = extract_blocks(page)
    assert [(b.lang, b.no_test) for b in blocks] == [
        ("bash", None),
        ("python", None),
        ("bash", None),
        ("python", None),
        ("python", "needs a GPU"),
        ("text", None),
    ]
    make_photos(tmp_path)
    check_block(blocks[0], tmp_path)  # blocks share the page's directory, in order
    check_block(blocks[1], tmp_path)
    for broken, says in [(blocks[2], "nowhere"), (blocks[3], "no_such_name")]:
        with pytest.raises(pytest.fail.Exception, match=f"(?s)exited [1-9].*{says}"):
            check_block(broken, tmp_path)
    assert "reached only without -e" not in run_block(blocks[2], tmp_path).stdout


def test_a_fence_without_a_language_or_unclosed_is_refused(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("```\nconverter/\n```\n")
    with pytest.raises(ValueError, match="without a language"):
        extract_blocks(page)
    page.write_text("```bash\nls\n")
    with pytest.raises(ValueError, match="not closed"):
        extract_blocks(page)
    page.write_text("<!-- no-test: -->\n```bash\nls\n```\n")
    with pytest.raises(ValueError, match="without a reason"):
        extract_blocks(page)


LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(page: Path):
    # A page moved or renamed must not leave links to nowhere (URLs and #anchors are not checked).
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    broken = [
        m["target"]
        for m in LINK.finditer(text)
        if "://" not in m["target"]
        and not m["target"].startswith("#")
        and not (page.parent / m["target"].split("#")[0]).exists()
    ]
    assert not broken, f"{page.name}: links to missing files: {broken}"
