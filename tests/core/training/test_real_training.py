"""Short real training runs: the loss falls on real data, and every WMT14 preset runs end to end.

Tiny models and a few dozen updates: these pin that the whole path (recipe, tokenizer,
binarising, batching, model, optimiser, validation with the task metric, test evaluation)
works on the real corpora beside the project, not that the models are good.
"""

import json
from pathlib import Path

import pytest
from conftest import MULTI30K, NLTK_DATA, multi30k_slice, needs
from s2s.core.setup.config import load_config
from s2s.core.training.trainer import train


def _losses(run_dir) -> list[float]:
    records = [json.loads(line) for line in open(Path(run_dir) / "metrics.jsonl")]
    return [r["loss"] for r in records if r["kind"] == "train"]


def _falls(losses: list[float], by: float) -> bool:
    """The last quarter's mean loss is at least `by` nats below the first update's."""
    tail = losses[-(len(losses) // 4) :]
    return sum(tail) / len(tail) < losses[0] - by


@pytest.mark.slow
@needs(MULTI30K)
def test_multi30k_slice_loss_falls(registry, tiny, tmp_path):
    data = multi30k_slice(tmp_path / "m30k", {"train": 3000, "val": 50, "test_2016_flickr": 50})
    cfg = load_config(
        "multi30k_en_de",
        tiny(
            f"task.data_dir={data}",
            "task.vocab_size=1000",
            "model.d_model=64",
            "model.d_ff=128",
            "data.max_tokens=1500",
            "optim.max_updates=60",
            "optim.warmup=20",
            "optim.lr_scale=1.0",
            "run.log_interval=2",
            "run.valid_interval=60",
            "run.save_interval=60",
            "run.valid_max_sentences=10",
            "run.average_last=0",
            "run.threads=0",
        ),
        registry=registry,
    )
    result = train(cfg, registry, quiet=True)
    assert _falls(_losses(cfg.run.dir), by=1.5), _losses(cfg.run.dir)
    assert set(result["test"]) >= {"bleu", "bleu_tok", "chrf"}


@pytest.mark.slow
@needs(NLTK_DATA)
def test_treebank_sample_loss_falls(registry, tiny):
    cfg = load_config(
        "ptb_sample_parsing",
        tiny(
            f"task.nltk_data={NLTK_DATA}",
            "model.d_model=64",
            "model.d_ff=128",
            "data.max_tokens=2500",
            "optim.max_updates=60",
            "optim.warmup=20",
            "optim.lr_scale=1.0",
            "run.log_interval=2",
            "run.valid_interval=60",
            "run.save_interval=60",
            "run.valid_max_sentences=4",
            "run.average_last=0",
            "run.threads=0",
            "decode.beam=2",
            "decode.max_len_b=20",
        ),
        registry=registry,
    )
    result = train(cfg, registry, quiet=True)
    assert _falls(_losses(cfg.run.dir), by=1.0), _losses(
        cfg.run.dir
    )  # ~60 target tokens: ln 60 = 4.1
    assert "f1" in result["test"] and "repaired" in result["test"]


@pytest.mark.parametrize(
    "preset", ["wmt14_en_de_base", "wmt14_en_de_big", "wmt14_en_fr_base", "wmt14_en_fr_big"]
)
def test_wmt14_presets_prepare_and_train_on_a_local_copy(preset, registry, tiny, tmp_path):
    import datasets

    pair = "de-en" if "en_de" in preset else "fr-en"
    other = pair[:2]
    root = tmp_path / "wmt14"
    (root / pair).mkdir(parents=True)
    features = datasets.Features({"translation": datasets.Translation(languages=[other, "en"])})
    for split, n in (("train", 300), ("validation", 12), ("test", 12)):
        rows = [
            {
                "translation": {
                    other: f"Satz {i} {other} aus {split} , mit Wörtern .",
                    "en": f"Sentence {i} from {split} , with words .",
                }
            }
            for i in range(n)
        ]
        datasets.Dataset.from_list(rows, features=features).to_parquet(
            str(root / pair / f"{split}-00000-of-00001.parquet")
        )
    cfg = load_config(
        preset,
        tiny(
            f"task.local_dir={root}",
            "task.vocab_size=600",
            "data.max_tokens=800",
            "optim.max_updates=4",
            "optim.warmup=2",
            "run.valid_interval=4",
            "run.save_interval=2",
            "run.valid_max_sentences=4",
            "decode.max_len_b=5",
            "run.threads=0",
        ),
        registry=registry,
    )
    result = train(cfg, registry, quiet=True)
    assert result["update"] == 4 and result["averaged"] == 2
    assert (Path(cfg.run.dir) / "tokenizer.json").is_file() and (
        Path(cfg.run.dir) / "test.hyp.txt"
    ).is_file()
