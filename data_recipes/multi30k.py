"""Multi30k task 1 (Elliott et al. 2016): the official release files, fetched once into the cache.

The release (github.com/multi30k/dataset, data/task1/raw) holds gzipped raw text,
`{split}.{lang}.gz`, one caption per line, line i of every language translating line i of the
others. `fetch` downloads the files a task needs into `data_home()/multi30k` (or a given
folder) as plain `{split}.{lang}` files, which `parallel_text` then reads like any local copy.

Checks, honestly stated: for train, val and test_2016_flickr in en/de/fr the sha256 of the
decompressed text is pinned below (computed from a copy of those release files). For
test_2017_flickr and test_2017_mscoco no copy was at hand to hash, so those files are only
checked for their published number of lines (1,000 and 461), the same for every language.
`S2S_MULTI30K_URL` replaces the base URL (a mirror, or a local server in the tests). With
`S2S_SHARED_DATA=DIR` set, the files are read from DIR/multi30k and never downloaded.

A file already in the folder is checked again before every use, by size and sha256 (or line
count), not trusted for its name: a file damaged or cut short since it was fetched is a
`DataError` naming it and saying how to fetch it again. The check is remembered per process by
(path, size, mtime), so a run hashes each file once (about 6 MB for train.{en,de,fr}). A copy
named by `task.data_dir` is the user's own and is read as it is.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import Iterable

from s2s.core.errors import DataError

from . import SHARED_ENV, data_home, shared_data
from .download import fetch_gzip

log = logging.getLogger(__name__)

BASE_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw"
LANGS = ("en", "de", "fr")
#: split -> lines (every language of a split has as many)
SPLITS = {
    "train": 29_000,
    "val": 1_014,
    "test_2016_flickr": 1_000,
    "test_2017_flickr": 1_000,
    "test_2017_mscoco": 461,
}
#: sha256 of the decompressed text, where known (see the module docstring)
SHA256 = {
    ("train", "en"): "460a15fbd157e34a7a9957ee388c1ca247fe47af3ef25fb50442af6c274e0fc6",
    ("train", "de"): "2c2b73fd2b548fbcde3a875e0a78d6ee94d498bfdee6bd3eae3945779e9ddf72",
    ("train", "fr"): "5925a3c18f1587b6b54b87743106e6e8ab93618edb6f65d19eac0621f853a10d",
    ("val", "en"): "1f2a23d992769b5b3d209b0a10dd0b77c08cceb1f20dfb97ed0aafa49d107227",
    ("val", "de"): "660e09eb7e1da2f856ea13ee5ad3cf6d36b3d5b0b733c857e94c5747a3dfc660",
    ("val", "fr"): "5304e444d842e962b2dda4d816b70b22a1765b15401642b7ca37a67477e708dc",
    ("test_2016_flickr", "en"): "399a4382932c1aadd3ceb9bef1008d388a64c76d4ae4e9d4728c6f4301cac182",
    ("test_2016_flickr", "de"): "4be6b5b3236b79c25475c6bb829800a7ce559e9ba7a1f6c2394fe4d40be46d16",
    ("test_2016_flickr", "fr"): "cb3160d69b002bb638e66cc7612fcd56cb0af82eadc9c142dedc438afb885ef6",
}
#: size in bytes of the decompressed text, where its sha256 is pinned
SIZES = {
    ("train", "en"): 1_801_238,
    ("train", "de"): 2_110_398,
    ("train", "fr"): 2_111_303,
    ("val", "en"): 63_297,
    ("val", "de"): 75_981,
    ("val", "fr"): 73_924,
    ("test_2016_flickr", "en"): 62_076,
    ("test_2016_flickr", "de"): 70_649,
    ("test_2016_flickr", "fr"): 72_261,
}
FETCH_COMMAND = "python -m s2s.data_recipes multi30k"
_CHUNK = 1 << 20
_VERIFIED: dict[
    str, tuple[int, int]
] = {}  # resolved path -> (size, mtime_ns) found good in this process


def base_url() -> str:
    return os.environ.get("S2S_MULTI30K_URL", BASE_URL).rstrip("/")


def default_dir() -> Path:
    return data_home() / "multi30k"


def fetch(
    directory: str | Path | None = None,
    splits: Iterable[str] = SPLITS,
    langs: Iterable[str] = LANGS,
) -> Path:
    """The folder holding `{split}.{lang}` for every split and language asked for, downloading
    (and verifying) the files that are not there yet; returns the folder."""
    shared = shared_data() if not directory else None
    directory = (
        Path(directory).expanduser()
        if directory
        else shared / "multi30k"
        if shared
        else default_dir()
    )
    for split in splits:
        if split not in SPLITS:
            raise DataError(f"Multi30k has no split {split!r}; it has {', '.join(SPLITS)}")
        for lang in langs:
            if lang not in LANGS:
                raise DataError(f"Multi30k has no language {lang!r}; it has {', '.join(LANGS)}")
            dest = directory / f"{split}.{lang}"
            if dest.is_file():  # verified when it got its final name, and again now
                verify(dest, split, lang)
                continue
            if shared:
                raise DataError(
                    f"{dest} does not exist: {SHARED_ENV}={shared} names the folder holding the corpora "
                    f"(nothing is downloaded while it is set); fetch them there with `{FETCH_COMMAND} "
                    f"--dir {shared}`, or unset {SHARED_ENV}"
                )
            url = f"{base_url()}/{split}.{lang}.gz"
            log.info("downloading %s to %s", url, dest)
            try:
                fetch_gzip(url, dest, SHA256.get((split, lang)), SPLITS[split])
            except DataError as e:
                raise DataError(
                    f"Multi30k {split}.{lang} is not in {directory} and could not be fetched: "
                    f"{e}; run `{FETCH_COMMAND}` where there is network access, or set "
                    f"task.data_dir to a folder holding {split}.{lang}"
                ) from None
            _remember(dest)
    return directory


def verify(path: Path, split: str, lang: str) -> None:
    """`path`, the fetched file `{split}.{lang}`, has its pinned size and sha256 (or its published
    line count), or a DataError names it; cheap when this process found it good already."""
    path = Path(path)
    stat = path.stat()
    if _VERIFIED.get(str(path.resolve())) == (stat.st_size, stat.st_mtime_ns):
        return
    problem = _problem(path, split, lang, stat.st_size)
    if problem:
        raise DataError(
            f"{path}: damaged or truncated Multi30k file ({problem}); delete it and run again "
            f"to fetch it anew (or `{FETCH_COMMAND}`), or set task.data_dir to a good copy"
        )
    _remember(path, stat)


def _problem(path: Path, split: str, lang: str, size: int) -> str:
    """What is wrong with the file, or ""."""
    expected = SIZES.get((split, lang))
    if expected is not None and size != expected:
        return f"{size} bytes, expected {expected}"
    digest, lines = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            lines += chunk.count(b"\n")
    pinned = SHA256.get((split, lang))
    if pinned is not None and digest.hexdigest() != pinned:
        return f"sha256 {digest.hexdigest()}, expected {pinned}"
    if pinned is None and lines != SPLITS[split]:
        return f"{lines} lines, expected {SPLITS[split]}"
    return ""


def _remember(path: Path, stat: os.stat_result | None = None) -> None:
    stat = stat or path.stat()
    _VERIFIED[str(path.resolve())] = (stat.st_size, stat.st_mtime_ns)
