"""Where a dataset is (a local path or a URL), and what to say when it is not there.

A user names a dataset by its directory or URL; a mistyped path, a shard given for its dataset,
shards without an index, an unfinished pack and a URL with a slash missing each get a message naming
the command to run next. Standard library only, as :mod:`.manifest`, which reads the index.
"""

from __future__ import annotations

import contextlib
import difflib
import itertools
import os
import re
from pathlib import Path

from .imageformats import IMG_EXTENSIONS, PHOTO_EXTENSIONS  # re-exported: where a dataset's images are
from .protocols import FILE_PREFIX, SCHEMES

__all__ = [
    "IMG_EXTENSIONS",
    "INDEX_NAME",
    "PHOTO_EXTENSIONS",
    "image_tree",
    "is_url",
    "local_path",
    "missing_path",
    "no_index",
    "not_a_dataset",
    "redact_url",
    "shown_cause",
    "url_typo",
]

INDEX_NAME = "index.json"
# Entries read in a folder to tell what it holds: a hint for a message, not a scan.
_PEEK = 64
_PEEK_FOLDERS = 8


def is_url(root: object) -> bool:
    """Whether ``root`` is a URL read through fsspec (``s3://``, ``gs://``, ``https://``...), not a path.

    ``file://`` URLs count as local paths.
    """
    return isinstance(root, str) and "://" in root and not root.startswith(FILE_PREFIX)


# The user-info part of every URL in a text: ``scheme://`` then anything up to the last ``@`` before
# the path (a password may hold a raw ``@``), stopping at what ends a URL in a message.
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/?#\s'\"<>]*)@")


def redact_url(text: str) -> str:
    """``text`` (a URL, or a message holding URLs) with the credentials in each URL hidden, to show a person.

    ``https://user:secret@host/ds`` -> ``https://user:****@host/ds``; a user name alone (often a token)
    -> ``https://****@host/ds``, as pip's ``redact_auth_from_url``. Every URL the project prints (an
    error, a warning, a log line, a progress bar, ``--json``, the index's recorded source) goes
    through it, and so does the text of an error from a file system, which may quote its URL whole.
    """
    if "@" not in text:  # the common case: nothing to hide, no regular expression run
        return text

    def hide(m: re.Match[str]) -> str:
        user, colon, _ = m["userinfo"].partition(":")
        shown_user = f"{user}:****" if colon else "****"
        return f"{m['scheme']}{shown_user}@"

    return _USERINFO.sub(hide, text)


def shown_cause(error: BaseException) -> BaseException | None:
    """``error``, to chain to the error raised for it; None where its text (or its causes') holds a secret.

    A traceback prints every chained error whole, and a file system's errors quote the URL they
    failed on, ``user:password@`` included: chain ``from shown_cause(e)``, and put ``e``'s text,
    through :func:`redact_url`, in the message.
    """
    seen: BaseException | None = error
    for _ in range(16):  # a chain is short; a cycle must not loop
        if seen is None:
            return error
        if redact_url(str(seen)) != str(seen):
            return None
        seen = seen.__cause__ or seen.__context__
    return error


def url_typo(root: object) -> str | None:
    """If ``root`` reads as a URL with a slash missing (``s3:/bucket/x``, ``gs:bucket``), the URL meant.

    Such a string is a valid local path (``./s3:/bucket/x``), so without this check ``pack`` would
    write into a local folder named ``s3:``.
    """
    if not isinstance(root, (str, os.PathLike)):
        return None
    text = os.fspath(root)
    if not isinstance(text, str) or "://" in text:
        return None
    scheme, colon, rest = text.partition(":")
    # The schemes of fsspec's common file systems (.protocols): ``s3:/bucket``, ``gs:bucket``...
    if not colon or scheme.lower() not in SCHEMES:
        return None
    return f"{scheme}://{rest.lstrip('/')}"


def local_path(root: str | os.PathLike[str]) -> Path:
    """A local path, ``file://`` prefix removed and a leading ``~`` (or ``~user``) expanded.

    ``ImageFolder("~/ds/train")`` and ``ShardDataset("~/ds")`` read the user's home, as torchvision's
    ``ImageFolder`` does (it expands ``~``); the shell expands it on a command line, a string in a
    script it never sees. A path without a leading ``~`` is returned as it is.
    """
    text = os.fspath(root)
    return Path(os.path.expanduser(text[len(FILE_PREFIX) :] if text.startswith(FILE_PREFIX) else text))


def not_a_dataset(path: Path) -> str:
    """The message for a file given where a dataset's directory (or its index) was expected."""
    what = "a shard" if path.suffix == ".tar" else "a file"
    return (
        f"{path} is {what}, not a packed dataset: give the dataset's directory, the one that holds "
        f"{INDEX_NAME} (here probably {path.parent})"
    )


def no_index(path: Path) -> str:
    """Why a local dataset has no index, and the command to run next."""
    folder = path.parent
    if path.name != INDEX_NAME or not folder.is_dir():  # an index file named outright, or a race
        return f"{path} does not exist: {missing_path(path)}"
    if (folder / ".imgshards").is_dir():
        return (
            f"no {INDEX_NAME} in {folder}: `imgshards pack` has not finished there; run the same pack "
            "command again, it resumes from the shards already written"
        )
    with contextlib.suppress(OSError):
        shards = sum(1 for p in folder.glob("*.tar") if p.is_file())
        if shards:
            return (
                f"no {INDEX_NAME} in {folder}, which holds {shards} .tar file{'s' if shards != 1 else ''}: "
                f"if another tool wrote these shards, run `imgshards index {folder}` once (per split: "
                "--split NAME --shards 'GLOB') to read them as a dataset"
            )
    tree = image_tree(folder)
    if tree is not None:  # the tree to pack, given where the shards were meant
        what = "is an ImageFolder tree" if tree == folder else f"holds the ImageFolder tree {tree}"
        return (
            f"no {INDEX_NAME} in {folder}: it {what} (class folders of images), not a packed dataset; "
            f"pack it into a new directory with `imgshards pack {tree} DST`, then give DST here"
        )
    return f"no {INDEX_NAME} in {folder}: not a packed dataset; make one with `imgshards pack SRC {folder}`"


def image_tree(folder: Path) -> Path | None:
    """``folder`` if it looks like an ImageFolder tree, else its first subfolder that does, else None.

    A tree is a folder with a subfolder that holds an image at its top. Reads a few dozen entries of
    a few folders only: it picks the message for a folder given where a dataset was expected.
    """
    subfolders = _subfolders(folder)
    if any(_holds_image(sub) for sub in subfolders[:_PEEK_FOLDERS]):
        return folder
    for sub in subfolders[:_PEEK_FOLDERS]:  # photos/ holding train/ and val/
        if any(_holds_image(inner) for inner in _subfolders(sub)[:_PEEK_FOLDERS]):
            return sub
    return None


def _subfolders(folder: Path) -> list[Path]:
    try:
        with os.scandir(folder) as it:
            return sorted(Path(e.path) for e in itertools.islice(it, _PEEK) if e.is_dir())
    except OSError:
        return []


def _holds_image(folder: Path) -> bool:
    try:
        with os.scandir(folder) as it:
            return any(
                e.name.lower().endswith(IMG_EXTENSIONS + PHOTO_EXTENSIONS)
                for e in itertools.islice(it, _PEEK)
            )
    except OSError:
        return False


def missing_path(path: Path) -> str:
    """What to do about ``path``, which does not exist: the closest name there is, or where to look.

    The first component that does not exist is compared with the folders beside it (``difflib``):
    ``photos/trian`` -> ``did you mean photos/train?``; with none close, ``check the path: `ls photos```.
    """
    parts = path.parts
    for i in range(len(parts)):
        if not os.path.lexists(Path(*parts[: i + 1])):
            break
    else:
        return "check the path"
    parent = Path(*parts[:i]) if i else Path(".")
    try:
        with os.scandir(parent) as it:
            names = [e.name for e in itertools.islice(it, 10_000) if e.is_dir()]
    except OSError:
        names = []
    close = difflib.get_close_matches(parts[i], names, n=1, cutoff=0.6)
    if close:
        return f"did you mean {Path(*parts[:i], close[0], *parts[i + 1 :])}?"
    return f"check the path: `ls {parent}` shows what is there"
