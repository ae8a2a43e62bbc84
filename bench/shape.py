#!/usr/bin/env python3
"""The loader's shape, counted the same way on any version of the repository (issue 32).

Run by hand, on the imgshards that ``PYTHONPATH`` (or ``--ref``) gives::

    PYTHONPATH=.site python bench/shape.py             # this checkout (.site links its folders)
    python bench/shape.py --ref 255c059                # a git ref, put in a temporary folder

It uses only the standard library, webdataset and imgshards' public API (``converter.pack``,
``converter.make_synthetic_tree``, ``loader.ShardDataset``, ``loader.make_loader``), so it runs on
the old layout and the new one alike. It prints:

- **loader/ lines**: the newlines of every ``.py`` file under ``loader/`` (``wc -l`` of them all);
  **.py files**: how many; **top-level entries**: ``ls loader | wc -l``, ``__pycache__`` left out.
- **generator frames per sample**: it packs a synthetic tree (4 classes of 60 small JPEGs, one
  shard), iterates ``ShardDataset(dst, batch_size=8)`` in this process (``iter(dataset)``, no
  DataLoader, no workers), lets the first batch go (it fills the shuffle buffer) and watches the
  second with ``sys.setprofile``. At every yield of an imgshards or webdataset generator it walks
  the stack from that frame out to the consumer, and counts the frames whose code is a generator
  (``co_flags & inspect.CO_GENERATOR``) and whose file is in imgshards or webdataset. The figure is
  the largest such count in the batch: the yield of the innermost tar reader (the tar member
  parser, below the sample grouper), when the whole chain from the consumer down to the shard's
  bytes is on the stack. The chain is printed, consumer first. (On 255c059 that is 16: the 14 the
  issue counts, from ``SampleReader`` to the pass's outermost generator, plus the tar member parser
  below it and webdataset's pipeline iterator above it.)
- **modules a sample crosses**: the distinct imgshards and webdataset files (modules) with a frame
  on that deepest stack (generators or not), together with those whose Python functions are entered
  (profile ``call`` events, resumed generators included) while that one batch is made: the sample's
  way out through decoding, augmenting and collating, and whatever the loader calls per batch
  (counters, state). Both parts and the list are printed. Functions in C (torch, PIL) do not count.
- **modules a lost sample's count crosses**: the imgshards modules whose code handles the number
  of samples a pass lost to a damaged shard, from the run that lacks them to the warning and the
  ``max_lost`` judgement. It copies the packed split, cuts its shard to 40% of its bytes, and runs
  one pass of ``make_loader(ShardDataset(copy, batch_size=8, max_lost=0.9), num_workers=0)`` under
  ``sys.setprofile``. The pass loses ``L`` samples (``dataset.lost_samples`` after it). A module
  counts when one of its Python frames holds ``L``: an ``int`` equal to ``L`` among its arguments
  and locals (read at each ``call``, ``return`` and ``c_call`` event of that frame or of a function
  it calls) or returned by it; and the module that computed it (the caller of the first frame that
  holds it: ``on_lost(expected - got)`` holds it in no variable) and, when that first frame is a
  function made at run time (a callback), the module that made it (the caller of the function
  that returned it). A frame holding ``L`` by chance is told apart by a second pass over the
  undamaged copy, watched the same way: a function that holds ``L`` there too is left out. So
  the tar reader that meets the shard's end counts only if it hands on the number, and a module
  that passes a handle of the counters (not the count) does not. The modules are printed in the
  order the count reaches them, each with its functions. On 1bc048c that is 6: pipeline/read
  (computes it), pipeline/passes (made the callback), state/cursor, state/checkpoint, dataloader,
  dataset; issue 39's 7 also counted the tar reader, which ends the run but never holds the count.
  Since the pass's losses are told and judged by the epoch: 3, pipeline/runs -> state/cursor ->
  state/progress.

``--ref`` puts REF in a temporary folder the way ``bench/loader.py --against`` does (``git archive``,
its folders linked as ``site/imgshards``) and runs this script there with this interpreter.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import CodeType, FrameType, FunctionType
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def layout(loader: Path) -> tuple[int, int, int]:
    """(lines, .py files, top-level entries) of the loader folder."""
    files = [p for p in loader.rglob("*.py") if "__pycache__" not in p.parts]
    lines = sum(p.read_bytes().count(b"\n") for p in files)
    entries = [e for e in os.listdir(loader) if e != "__pycache__"]
    return lines, len(files), len(entries)


class Modules:
    """A frame's file as ``loader/pipeline/runs.py`` or ``webdataset/filters.py``; None if not ours.

    Ours: imgshards' three folders (each a link under ``site/imgshards`` in a checkout, so compared
    by real path) and webdataset.
    """

    def __init__(self, loader: Path) -> None:
        import webdataset

        folders = {loader.parent / folder: f"{folder}/" for folder in ("converter", "loader", "cli")}
        folders[Path(webdataset.__file__).parent] = "webdataset/"
        self.roots = {os.path.realpath(folder) + os.sep: shown for folder, shown in folders.items()}
        self.known: dict[str, str | None] = {}

    def __call__(self, filename: str) -> str | None:
        if filename not in self.known:
            real = os.path.realpath(filename)
            found = [shown + real[len(root) :] for root, shown in self.roots.items() if real.startswith(root)]
            self.known[filename] = found[0] if found else None
        return self.known[filename]


class Watch:
    """The profile hook: modules entered, and the deepest generator chain at a yield."""

    def __init__(self, module_of: Modules) -> None:
        self.module_of = module_of
        self.entered: set[str] = set()
        self.chain: list[tuple[str, str, bool]] = []  # (module, function, is a generator), consumer first
        self.depth = 0

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        module = self.module_of(frame.f_code.co_filename)
        if module is None:
            return
        if event == "call":
            self.entered.add(module)
        elif event == "return" and frame.f_code.co_flags & inspect.CO_GENERATOR and arg is not None:
            chain = list(self.stack(frame))
            depth = sum(generator for _, _, generator in chain)
            if depth > self.depth:
                self.depth, self.chain = depth, chain[::-1]

    def stack(self, frame: FrameType | None) -> Iterator[tuple[str, str, bool]]:
        """Our frames from ``frame`` out to the outermost."""
        while frame is not None:
            if (module := self.module_of(frame.f_code.co_filename)) is not None:
                yield module, frame.f_code.co_name, bool(frame.f_code.co_flags & inspect.CO_GENERATOR)
            frame = frame.f_back


def measure(work: Path, watch: Watch) -> None:
    from imgshards.converter import make_synthetic_tree, pack
    from imgshards.loader import ShardDataset

    tree = make_synthetic_tree(work / "tree", classes=4, per_class=60, size=(48, 40))
    pack(tree, work / "packed")
    batches = iter(ShardDataset(work / "packed", batch_size=8))
    next(batches)  # the first batch fills the shuffle buffer and opens the shard
    sys.setprofile(watch)
    try:
        next(batches)
    finally:
        sys.setprofile(None)


class Holders:
    """The profile hook of the lost count: which of our functions hold the int ``value``, in order."""

    def __init__(self, module_of: Modules, value: int) -> None:
        self.module_of, self.value = module_of, value
        # (module, function) -> (module, function) of its caller then, in the order first seen
        self.held: dict[tuple[str, str], tuple[str, str] | None] = {}
        self.codes: dict[tuple[str, str], CodeType] = {}
        # a function returned by one of ours -> the modules of the frames it was returned to
        self.makers: dict[CodeType, set[str]] = {}

    def holds(self, x: Any) -> bool:
        return type(x) is int and x == self.value

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event not in ("call", "return", "c_call"):
            return
        module = self.module_of(frame.f_code.co_filename)
        if module is not None and event == "return":
            if self.holds(arg):
                self.note(frame)
            if isinstance(arg, FunctionType) and (caller := self.ours(frame.f_back)) is not None:
                self.makers.setdefault(arg.__code__, set()).add(self.where(caller)[0])
        for f in (frame, frame.f_back):  # the frame, and its caller as it calls (its locals as handed on)
            ours = f is not None and self.module_of(f.f_code.co_filename) is not None
            if ours and any(self.holds(v) for v in f.f_locals.values()):  # type: ignore[union-attr]
                self.note(f)  # type: ignore[arg-type]

    def ours(self, frame: FrameType | None) -> FrameType | None:
        while frame is not None and self.module_of(frame.f_code.co_filename) is None:
            frame = frame.f_back
        return frame

    def where(self, frame: FrameType) -> tuple[str, str]:
        return self.module_of(frame.f_code.co_filename) or "?", frame.f_code.co_name

    def note(self, frame: FrameType) -> None:
        key = self.where(frame)
        if key not in self.held:
            caller = self.ours(frame.f_back)
            self.held[key] = None if caller is None else self.where(caller)
            self.codes[key] = frame.f_code


def lost_pass(root: Path, value: int, module_of: Modules) -> tuple[Holders, int]:
    """One pass over ``root`` watched for ``value``; the holders, and the samples the pass lost."""
    from imgshards.loader import ShardDataset, make_loader

    holders = Holders(module_of, value)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the cut shard's, warned about as the dataset is made and read
        dataset = ShardDataset(root, batch_size=8, max_lost=0.9)
        loader = make_loader(dataset, num_workers=0)
        sys.setprofile(holders)
        try:
            for _ in loader:
                pass
        finally:
            sys.setprofile(None)
    return holders, dataset.lost_samples


def lost_count(work: Path, module_of: Modules) -> tuple[int, list[tuple[str, list[str]]]]:
    """The samples a pass over a cut copy of ``work/packed`` lost, and the modules their count crosses.

    Each module with its functions (the way the count came in), in the order the count reached them.
    """
    clean, cut = work / "lost-clean", work / "lost-cut"
    shutil.copytree(work / "packed", clean)
    shutil.copytree(work / "packed", cut)
    for shard in sorted(cut.rglob("*.tar")):
        shard.write_bytes(shard.read_bytes()[: shard.stat().st_size * 2 // 5])
    _, lost = lost_pass(cut, -1, module_of)  # how many it loses (the pass is the same each time)
    if not lost:
        raise SystemExit("the cut shard lost no sample: nothing to follow")
    by_chance = set(lost_pass(clean, lost, module_of)[0].held)
    damaged, again = lost_pass(cut, lost, module_of)
    assert again == lost, (again, lost)  # the same loss each time
    held = [(key, caller) for key, caller in damaged.held.items() if key not in by_chance]
    crossed: dict[str, list[str]] = {}
    if held:
        (first, caller) = held[0]
        if caller is not None:
            crossed.setdefault(caller[0], []).append(f"{caller[1]} (computed it)")
        for maker in sorted(damaged.makers.get(damaged.codes[first], ())):
            crossed.setdefault(maker, []).append("(made the callback it is handed to)")
    for (module, function), _ in held:
        crossed.setdefault(module, []).append(function)
    return lost, list(crossed.items())


def report() -> None:
    import imgshards.loader

    loader = Path(imgshards.loader.__file__).parent
    lines, files, entries = layout(loader)
    watch = Watch(Modules(loader))
    with tempfile.TemporaryDirectory() as work:
        measure(Path(work), watch)
        lost, lost_crossed = lost_count(Path(work), watch.module_of)
    on_chain = {module for module, _, _ in watch.chain}
    crossed = on_chain | watch.entered
    print(f"imgshards loader: {os.path.realpath(loader)}")
    print(f"loader/ lines: {lines}")
    print(f"loader/ .py files: {files}")
    print(f"loader/ top-level entries: {entries}")
    print(
        f"modules a sample crosses: {len(crossed)} "
        f"({len(on_chain)} on the deepest stack + {len(crossed - on_chain)} more entered in one batch)"
    )
    print(f"generator frames per sample: {watch.depth}")
    print("deepest stack at a yield, consumer first (* = generator):")
    for module, function, generator in watch.chain:
        print(f"  {'*' if generator else ' '} {module}:{function}")
    print("modules entered in one batch, besides those on the stack:")
    for module in sorted(crossed - on_chain):
        print(f"    {module}")
    print(f"modules a lost sample's count crosses: {len(lost_crossed)} (a pass that lost {lost} samples)")
    for module, functions in lost_crossed:
        print(f"    {module}: {', '.join(functions)}")


def run_at(ref: str) -> int:
    """Run this script on git ref ``ref`` (``bench/loader.py``'s ``install_ref``), return its status."""
    spec = importlib.util.spec_from_file_location("bench_loader", REPO / "bench" / "loader.py")
    assert spec and spec.loader
    bench_loader = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_loader)
    with tempfile.TemporaryDirectory() as where:
        python = bench_loader.install_ref(ref, Path(where))
        return subprocess.run([str(python), __file__]).returncode


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ref", help="a git ref of this repository to count instead of the imgshards imported")
    args = p.parse_args()
    if args.ref:
        sys.exit(run_at(args.ref))
    report()


if __name__ == "__main__":
    main()
