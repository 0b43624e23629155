"""Translation data recipes: WMT14 offline in the hub's schema, parallel text files, bad input."""

from __future__ import annotations

import gzip
import logging

import pytest
from conftest import MULTI30K, corpus
from omegaconf import OmegaConf
from s2s.core.data.members import task_section
from s2s.core.errors import DataError
from s2s.core.setup.config import load_config
from s2s.data_recipes import parallel_text, wmt14
from s2s.plugins.translation import TranslationConfig, TranslationTask

HUB_SPLITS = {"train": 300, "validation": 20, "test": 30}


def _rows(split: str, n: int, other: str = "de") -> list[dict]:
    return [
        {
            "translation": {
                other: f"Das ist Satz {i} aus {split}.",
                "en": f"This is sentence {i} from {split}.",
            }
        }
        for i in range(n)
    ]


def _hub_dataset(split: str, n: int, other: str = "de"):
    import datasets

    features = datasets.Features({"translation": datasets.Translation(languages=[other, "en"])})
    return datasets.Dataset.from_list(_rows(split, n, other), features=features)


@pytest.fixture(scope="module")
def wmt14_parquet(tmp_path_factory):
    """A few hundred pairs laid out as the hub's parquet files: de-en/{split}-00000-of-00001.parquet."""
    root = tmp_path_factory.mktemp("wmt14")
    (root / "de-en").mkdir()
    for split, n in HUB_SPLITS.items():
        _hub_dataset(split, n).to_parquet(str(root / "de-en" / f"{split}-00000-of-00001.parquet"))
    return root


def _task(**kw):
    return TranslationTask(OmegaConf.merge(OmegaConf.structured(TranslationConfig), kw))


# -- WMT14 ---------------------------------------------------------------------------------------
def test_wmt14_offline_from_parquet_in_the_hub_schema(wmt14_parquet):
    task = _task(source="wmt14", src_lang="en", tgt_lang="de", local_dir=str(wmt14_parquet))
    for split, hub_split in (("train", "train"), ("valid", "validation"), ("test", "test")):
        pairs = list(task.read_split(split))
        assert len(pairs) == HUB_SPLITS[hub_split]
        assert pairs[3] == (
            f"This is sentence 3 from {hub_split}.",
            f"Das ist Satz 3 aus {hub_split}.",
        )
    reverse = _task(source="wmt14", src_lang="de", tgt_lang="en", local_dir=str(wmt14_parquet))
    first = next(iter(reverse.read_split("train")))
    assert first == ("Das ist Satz 0 aus train.", "This is sentence 0 from train.")


def test_wmt14_reads_rows_lazily(wmt14_parquet):
    pairs = wmt14.read_split("train", "en", "de", local_dir=str(wmt14_parquet))
    assert (
        not isinstance(pairs, (list, tuple)) and next(pairs)[0] == "This is sentence 0 from train."
    )


def test_wmt14_offline_from_save_to_disk(tmp_path):
    import datasets

    copy = tmp_path / "copy"
    datasets.DatasetDict({s: _hub_dataset(s, n) for s, n in HUB_SPLITS.items()}).save_to_disk(
        str(copy)
    )
    pairs = list(wmt14.read_split("valid", "de", "en", local_dir=str(copy)))
    assert len(pairs) == 20
    assert pairs[0] == ("Das ist Satz 0 aus validation.", "This is sentence 0 from validation.")


def test_wmt14_hub_path_asks_datasets_for_wmt14(monkeypatch):
    import datasets

    calls = []

    def fake_load_dataset(name, config, split):
        calls.append((name, config, split))
        return _hub_dataset(split, 5, config[:2])

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    assert len(list(_task(source="wmt14", src_lang="en", tgt_lang="de").read_split("test"))) == 5
    list(_task(source="wmt14", src_lang="fr", tgt_lang="en").read_split("valid"))
    assert calls == [("wmt14", "de-en", "test"), ("wmt14", "fr-en", "validation")]


def test_wmt14_errors_name_what_is_missing(wmt14_parquet, tmp_path, monkeypatch, caplog):
    import datasets

    with pytest.raises(DataError, match="no split 'test' found"):
        wmt14.read_split("test", "en", "de", local_dir=str(tmp_path))
    with pytest.raises(DataError, match="does not exist"):
        wmt14.read_split("test", "en", "de", local_dir=str(tmp_path / "nowhere"))
    with pytest.raises(DataError, match="lacks 'fr'"):
        next(wmt14.read_split("train", "en", "fr", config="de-en", local_dir=str(wmt14_parquet)))
    with pytest.raises(DataError, match="English"):
        wmt14.hub_config("de", "fr")

    def offline(*args, **kw):
        raise ConnectionError("no internet")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(DataError, match="local_dir"):
        wmt14.read_split("train", "en", "de")
    rows = _rows("train", 4)
    rows[1]["translation"]["de"] = "  "
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: datasets.Dataset.from_list(rows))
    with caplog.at_level(logging.WARNING):
        assert len(list(wmt14.read_split("train", "en", "de"))) == 3
    assert "dropped 1 pairs" in caplog.text


def _parquet(path, rows) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), str(path))


def test_wmt14_parquet_shard_sets_are_read_whole_and_once(tmp_path):
    """Issue 77: a shard set missing a member (train-00000-of-00002 alone) prepared half a
    corpus with no word; train.parquet beside train-*-of-* was read twice; values that are not
    strings were an internal error. Each is one DataError naming the file or row."""
    half = tmp_path / "half"
    _parquet(half / "train-00000-of-00002.parquet", _rows("train", 5))
    with pytest.raises(DataError, match=r"train-00001-of-00002.parquet is missing.*2 shards"):
        wmt14.read_split("train", "en", "de", local_dir=str(half))
    twice = tmp_path / "twice"
    _parquet(twice / "train-00000-of-00001.parquet", _rows("train", 5))
    _parquet(twice / "train.parquet", _rows("train", 5))
    with pytest.raises(DataError, match=r"train.parquet.*read twice; keep one layout"):
        wmt14.read_split("train", "en", "de", local_dir=str(twice))
    whole = tmp_path / "whole"
    for i in range(2):
        _parquet(whole / f"train-0000{i}-of-00002.parquet", _rows("train", 5))
    assert len(list(wmt14.read_split("train", "en", "de", local_dir=str(whole)))) == 10
    typed = tmp_path / "typed"
    _parquet(typed / "train.parquet", [{"translation": {"de": 7 + i, "en": "x"}} for i in range(3)])
    with pytest.raises(DataError, match=r"row 1: translation\['de'\] is int '7', not a string"):
        list(wmt14.read_split("train", "en", "de", local_dir=str(typed)))


def test_wmt14_preset_reads_a_local_copy(wmt14_parquet):
    cfg = load_config(
        "wmt14_en_de_base", [f"task.local_dir={wmt14_parquet}"], task_config_cls=TranslationConfig
    )
    task = TranslationTask(task_section(cfg.task))
    assert task.splits == ("train", "valid", "test")
    pairs = list(task.read_split("train"))
    task.build_vocab(iter(pairs))
    ids = task.encode_source([pairs[0][0]])
    assert (
        len(ids[0]) > 3 and task.decode_target(task.encode_target([pairs[0][1]])[0]) == pairs[0][1]
    )


# -- parallel text -------------------------------------------------------------------------------
SRC = ["A man rides a bike.", "Two dogs play.", "", "  A woman sings.  ", "Kids run."]
TGT = ["Ein Mann fährt Rad.", "Zwei Hunde spielen.", "Leer.", "Eine Frau singt.", "Kinder rennen."]


def _write(path, lines, gz=False):
    data = ("\n".join(lines) + "\n").encode("utf-8")
    if gz:
        with gzip.open(path.with_name(path.name + ".gz"), "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)


@pytest.mark.parametrize("gz", [False, True])
def test_text_files_plain_and_gzipped(tmp_path, gz, caplog):
    _write(tmp_path / "train.en", SRC, gz)
    _write(tmp_path / "train.de", TGT, gz)
    with caplog.at_level(logging.WARNING):
        pairs = list(_task(data_dir=str(tmp_path)).read_split("train"))
    assert pairs == [(s.strip(), t) for s, t in zip(SRC, TGT) if s]
    assert "dropped 1 pairs with an empty side" in caplog.text
    kept = list(_task(data_dir=str(tmp_path), drop_empty=False).read_split("train"))
    assert len(kept) == 5 and kept[2] == ("", "Leer.")


def test_text_mixed_plain_and_gzip_last_line_without_newline(tmp_path):
    _write(tmp_path / "x.en", SRC, gz=True)
    (tmp_path / "x.de").write_text("\n".join(TGT), encoding="utf-8")  # no final newline
    assert len(list(parallel_text.read_split(tmp_path, "x", "en", "de"))) == 4


def test_text_different_line_counts_fail_before_any_pair(tmp_path):
    _write(tmp_path / "train.en", SRC)
    _write(tmp_path / "train.de", TGT[:-1], gz=True)
    with pytest.raises(DataError) as e:
        parallel_text.read_split(
            tmp_path, "train", "en", "de"
        )  # raised on the call, not on iteration
    msg = str(e.value)
    assert (
        f"{tmp_path / 'train.en'} has 5 lines" in msg and f"{tmp_path / 'train.de.gz'} has 4" in msg
    )


@pytest.mark.parametrize("gz", [False, True])
def test_text_invalid_utf8_names_file_and_line(tmp_path, gz):
    _write(tmp_path / "train.en", SRC, gz)
    path = tmp_path / "train.de"
    data = b"Ein Mann.\nZwei Hunde.\nLeer \xff\xfe.\nEine Frau.\nKinder.\n"
    if gz:
        path = path.with_name("train.de.gz")
        data = gzip.compress(data)
    path.write_bytes(data)
    with pytest.raises(DataError, match=rf"{path.name}, line 3: invalid UTF-8"):
        list(parallel_text.read_split(tmp_path, "train", "en", "de"))


def test_text_missing_files_and_splits(tmp_path):
    _write(tmp_path / "train.en", SRC)
    with pytest.raises(DataError, match=r"train\.de does not exist"):
        _task(data_dir=str(tmp_path)).read_split("train")
    with pytest.raises(DataError, match="data_dir"):
        _task().read_split("train")
    no_test = _task(data_dir=str(tmp_path), test_prefix="")
    assert no_test.splits == ("train", "valid")
    with pytest.raises(DataError, match="no 'test' split"):
        no_test.read_split("test")


# -- presets ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name,size,dropout,updates,average,model",
    [
        ("wmt14_en_de_base", 512, 0.1, 100_000, 5, "bpe"),
        ("wmt14_en_de_big", 1024, 0.3, 300_000, 20, "bpe"),
        ("wmt14_en_fr_base", 512, 0.1, 100_000, 5, "wordpiece"),
        ("wmt14_en_fr_big", 1024, 0.1, 300_000, 20, "wordpiece"),
    ],
)
def test_wmt14_presets_carry_the_papers_settings(name, size, dropout, updates, average, model):
    cfg = load_config(name, task_config_cls=TranslationConfig)
    m = cfg.model
    assert (m.layers, m.d_model, m.d_ff, m.heads) == (6, size, 4 * size, size // 64)
    assert (cfg.model.dropout, cfg.optim.max_updates, cfg.run.average_last) == (
        dropout,
        updates,
        average,
    )
    assert (cfg.optim.warmup, cfg.optim.label_smoothing, cfg.data.max_tokens) == (4000, 0.1, 25000)
    assert (cfg.task.tokenizer, cfg.task.vocab_size) == (model, 37000 if model == "bpe" else 32000)
    task = TranslationTask(task_section(cfg.task))
    assert cfg.task.shared_vocab and (
        task.decoding.beam,
        task.decoding.alpha,
        task.decoding.max_len_b,
    ) == (4, 0.6, 50)
    assert cfg.decode.beam is None and cfg.decode.alpha is None


@pytest.mark.parametrize("lang", ["de", "fr"])
def test_multi30k_presets_read_the_shared_corpus(lang):
    cfg = load_config(
        f"multi30k_en_{lang}",
        [f"task.data_dir={corpus(MULTI30K)}"],
        task_config_cls=TranslationConfig,
    )
    peak = cfg.optim.lr_scale * cfg.model.d_model**-0.5 * cfg.optim.warmup**-0.5
    assert peak == pytest.approx(2.0e-3, rel=0.05)  # the preset comment states this figure
    task = TranslationTask(task_section(cfg.task))
    sizes = {split: sum(1 for _ in task.read_split(split)) for split in task.splits}
    assert sizes == {"train": 29000, "valid": 1014, "test": 1000}


def test_parquet_shards_in_the_hubs_data_folder_are_prepared_as_a_stream(tmp_path):
    """2,400 pairs in two parquet files of small row groups under data/ (the hub's layout of a
    corpus without configs): read one record batch at a time, binarised in two shards by two
    processes, every pair there in order; a file that is not parquet is named."""
    import pyarrow.parquet as pq
    from s2s.core.data.nodes import prepare_data
    from s2s.core.setup.settings import DataConfig

    root = tmp_path / "hub"
    (root / "data").mkdir(parents=True)
    for i in range(2):
        table = _hub_dataset("train", 1200).data.table
        pq.write_table(table, root / "data" / f"train-0000{i}-of-00002.parquet", row_group_size=100)
    for split in ("validation", "test"):
        _hub_dataset(split, 5).to_parquet(str(root / "data" / f"{split}-00000-of-00001.parquet"))
    assert isinstance(wmt14.load("train", "en", "de", local_dir=str(root)), wmt14.ParquetFiles)
    task = _task(source="wmt14", local_dir=str(root), vocab_size=300)
    data = OmegaConf.structured(
        DataConfig(cache_dir=str(tmp_path / "c"), shard_pairs=1000, workers=2)
    )
    prepared = prepare_data(task, data, quiet=True)
    train = prepared.splits["train"]
    assert [len(p) for p in train.parts] == [1000, 1000, 400]
    ids = train.ids([1300])[0][0][:-1].tolist()
    assert task.src_vocab.decode(ids) == "This is sentence 100 from train."
    assert all(
        str(root / "data" / "train-00001-of-00002.parquet") in e["inputs"]
        for e in prepared.manifest["shards"]
    )
    (root / "data" / "train-00001-of-00002.parquet").write_bytes(b"not parquet")
    with pytest.raises(DataError, match="train-00001-of-00002.parquet: not a readable parquet"):
        list(wmt14.read_split("train", "en", "de", local_dir=str(root)))
