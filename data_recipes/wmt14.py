"""WMT14 English-German and English-French through the `datasets` library, as in the paper.

The hub's "wmt14" data set (configs "de-en" and "fr-en") supplies the training split, newstest2013
as `validation` (our "valid") and newstest2014 as `test`. Rows look like
`{"translation": {"de": "...", "en": "..."}}`; the direction is chosen by naming the source and
target languages. `local_dir` reads a copy in the same schema instead, offline: either a folder
written by `DatasetDict.save_to_disk` (arrow) or parquet files named by split as the hub names them
(`train-00000-of-00003.parquet`, `validation-*.parquet`, `test-*.parquet`, or `{split}/*.parquet`),
optionally under a `de-en`/`fr-en` or `data` subfolder. Any corpus in this schema (a
`translation` column of {language: sentence}) is read the same way.

Rows are read in batches from memory-mapped arrow, or streamed from parquet one record batch at
a time (pyarrow's `iter_batches`, files opened by Python so that the prepared cache fingerprints
them), never collected into Python lists: a corpus of tens of millions of pairs in parquet
shards is prepared without being held in memory.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Iterator

from s2s.core.errors import DataError

log = logging.getLogger(__name__)

HUB_NAME = "wmt14"
#: our split names -> the hub's
SPLITS = {"train": "train", "valid": "validation", "test": "test"}
_BATCH = 1000


def hub_config(src_lang: str, tgt_lang: str) -> str:
    """The hub config holding a language pair: "de-en" for en->de and for de->en."""
    pair = {src_lang, tgt_lang}
    if "en" not in pair or len(pair) != 2:
        raise DataError(f"WMT14 pairs English with another language; got {src_lang}->{tgt_lang}")
    return f"{(pair - {'en'}).pop()}-en"


def _local(root: Path, config: str, split: str):
    import datasets

    if not root.is_dir():
        raise DataError(f"WMT14 local copy {root} does not exist")
    for base in (root / config, root / "data", root):
        if (base / "dataset_dict.json").is_file():
            saved = datasets.load_from_disk(str(base))
            if split not in saved:
                raise DataError(f"{base} has no split {split!r} (it has {', '.join(saved)})")
            return saved[split]
        if (base / split / "state.json").is_file():
            return datasets.load_from_disk(str(base / split))
        files = _parquet_files(base, split)
        if files:
            return ParquetFiles(files)
    raise DataError(
        f"WMT14 local copy {root}: no split {split!r} found (looked for dataset_dict.json, "
        f"{split}/state.json, {split}-*.parquet, {split}.parquet, {split}/*.parquet in "
        f"{root / config} and {root})"
    )


#: a shard's name as the hub writes it: train-00000-of-00003.parquet
_SHARD = re.compile(r"(?P<index>\d+)-of-(?P<count>\d+)")


def _parquet_files(base: Path, split: str) -> list[Path]:
    """The parquet files of `split` in `base`, in order: one of the three layouts
    (`{split}-*.parquet`, `{split}.parquet`, `{split}/*.parquet`), never two at once (the
    split's pairs would be read twice), and a shard set `{split}-I-of-N` whole (a missing
    shard would prepare part of a corpus silently); else a DataError naming the files."""
    layouts = [
        sorted(base.glob(f"{split}-*.parquet")),
        sorted(base.glob(f"{split}.parquet")),
        sorted(base.glob(f"{split}/*.parquet")),
    ]
    found = [files for files in layouts if files]
    if len(found) > 1:
        shown = " and ".join(
            str(files[0]) + (f" (and {len(files) - 1} more)" if len(files) > 1 else "")
            for files in found
        )
        raise DataError(
            f"split {split!r} is in {shown}: its pairs would be read twice; keep one layout"
        )
    if not found:
        return []
    files = found[0]
    shards = {}
    for path in files:
        m = _SHARD.fullmatch(path.stem.removeprefix(f"{split}-"))
        if m and path.parent == base:
            shards[path] = (int(m["index"]), int(m["count"]))
    if shards:
        counts = sorted({count for _, count in shards.values()})
        if len(counts) > 1:
            raise DataError(
                f"{base}: the shards of split {split!r} disagree on their number "
                f"({', '.join(map(str, counts))}): one shard set a split"
            )
        count, width = counts[0], len(files[0].stem.split("-")[-1])
        have = {index for index, _ in shards.values()}
        for index in range(count):
            if index not in have:
                name = f"{split}-{index:0{width}d}-of-{count:0{width}d}.parquet"
                raise DataError(
                    f"{base / name} is missing: split {split!r} has {count} shards and "
                    f"{len(have)} are there (a part of the corpus would be left out)"
                )
    return files


class ParquetFiles:
    """Parquet files read in order, one record batch at a time (`iter`, as `datasets` names it)."""

    def __init__(self, paths: list[Path]):
        self.paths = paths

    def iter(self, batch_size: int):
        import pyarrow as pa
        import pyarrow.parquet as pq

        for path in self.paths:
            with open(path, "rb") as f:
                try:
                    for batch in pq.ParquetFile(f).iter_batches(batch_size=batch_size):
                        yield batch.to_pydict()
                except (pa.ArrowException, OSError) as e:
                    raise DataError(f"{path}: not a readable parquet file ({e})") from None


def load(
    split: str,
    src_lang: str,
    tgt_lang: str,
    hub_name: str = HUB_NAME,
    config: str = "",
    local_dir: str = "",
):
    """The `datasets` object (memory-mapped or streaming) for one of our splits."""
    if split not in SPLITS:
        raise DataError(f"WMT14 has no split {split!r}; it has {', '.join(SPLITS)}")
    config = config or hub_config(src_lang, tgt_lang)
    if local_dir:
        return _local(Path(local_dir), config, SPLITS[split])
    import datasets

    try:
        return datasets.load_dataset(hub_name, config, split=SPLITS[split])
    except Exception as e:  # offline, unknown name, ...: say what was asked for and how to avoid it
        raise DataError(
            f"cannot load {hub_name!r} config {config!r} split {SPLITS[split]!r} through "
            f"`datasets` ({type(e).__name__}: {e}); set task.local_dir to read a local copy "
            f"in the same schema"
        ) from e


def read_split(
    split: str,
    src_lang: str,
    tgt_lang: str,
    hub_name: str = HUB_NAME,
    config: str = "",
    local_dir: str = "",
    drop_empty: bool = True,
) -> Iterator[tuple[str, str]]:
    """Yield the (source, target) pairs of `split`, stripped; pairs with an empty side are dropped
    and counted when `drop_empty` is set."""
    ds = load(split, src_lang, tgt_lang, hub_name, config, local_dir)
    where = local_dir or f"{hub_name}/{config or hub_config(src_lang, tgt_lang)}"
    return _pairs(ds, f"{where} [{SPLITS[split]}]", src_lang, tgt_lang, drop_empty)


def _pairs(
    ds, where: str, src_lang: str, tgt_lang: str, drop_empty: bool
) -> Iterator[tuple[str, str]]:
    row = dropped = 0
    for batch in ds.iter(batch_size=_BATCH):
        if "translation" not in batch:
            raise DataError(
                f"{where}: rows have no 'translation' column (columns: {', '.join(batch)})"
            )
        for pair in batch["translation"]:
            row += 1
            missing = [
                lang
                for lang in (src_lang, tgt_lang)
                if not isinstance(pair, dict) or lang not in pair
            ]
            if missing:
                lacks = " and ".join(map(repr, missing))
                raise DataError(f"{where}, row {row}: translation {pair!r} lacks {lacks}")
            s, t = pair[src_lang], pair[tgt_lang]
            for lang, value in ((src_lang, s), (tgt_lang, t)):
                if value is not None and not isinstance(value, str):
                    raise DataError(
                        f"{where}, row {row}: translation[{lang!r}] is {type(value).__name__} "
                        f"{str(value)[:40]!r}, not a string"
                    )
            s, t = (s or "").strip(), (t or "").strip()
            if drop_empty and not (s and t):
                dropped += 1
                continue
            yield s, t
    if row == 0:
        raise DataError(f"{where} is empty")
    if dropped:
        log.warning("%s: dropped %d pairs with an empty side", where, dropped)
