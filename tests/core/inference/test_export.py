"""`s2s export`: a safetensors round trip, and CTranslate2 and Hugging Face exports whose greedy
output is `s2s generate --beam 1`'s, token for token.

Models are tiny and trained for a few dozen updates; the Multi30k case (slow, real data) does
the same on the real test set with a model trained on a slice of the real training set.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from s2s.core.decode.batched import Decoder
from s2s.core.contract.task import DecodeDefaults
from conftest import MULTI30K, multi30k_slice, needs
from s2s.core.apps.cli import main
from s2s.core.data.nodes import prepare_data
from s2s.core.decode.batched import source_batch
from s2s.core.decode.search import search
from s2s.core.inference import load_for_inference, load_run
from s2s.core.inference.deployed import decode_ctranslate2, decode_huggingface
from s2s.core.inference.formats.ctranslate2 import to_ctranslate2
from s2s.core.inference.formats.safetensors import load_safetensors
from s2s.core.setup.config import load_config
from s2s.core.runs import checkpoint
from s2s.core.training.trainer import train

needs_ct2 = pytest.mark.skipif(
    importlib.util.find_spec("ctranslate2") is None,
    reason="ctranslate2 is not installed (pip install -e '.[export]')",
)
needs_hf = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None,
    reason="transformers is not installed (pip install -e '.[export]')",
)


def _train_demo(registry, tiny, *extra):
    cfg = load_config(
        "demo",
        tiny(
            "task.train_size=1000",
            "task.valid_size=20",
            "task.test_size=150",
            "optim.max_updates=200",
            "optim.warmup=50",
            "run.valid_interval=200",
            "run.save_interval=100",
            *extra,
        ),
        registry=registry,
    )
    train(cfg, registry, quiet=True)
    return cfg.run.dir


def _greedy(run_dir, registry, n=None):
    """(task, model, settings, test sources, s2s's greedy ids) as `s2s generate --beam 1` decodes."""
    # the public way, as docs/export.md; in fp32, as the exports it is compared with
    run = load_run(run_dir, ["run.device=cpu", "decode.beam=1", "decode.precision=fp32"])
    task, model, settings = run.task, run.model, run.settings
    sources = prepare_data(task, run.cfg.data, quiet=True).texts("test")[0][:n]
    ids = task.encode_source(sources)
    hyps = search(
        model,
        source_batch(ids),
        DecodeDefaults(
            beam=1, alpha=settings.alpha, max_len_a=settings.max_len_a, max_len_b=settings.max_len_b
        ),
    )
    return task, model, settings, sources, [h.tokens for h in hyps]


def _export(run_dir, to, out, *extra):
    assert main(["export", str(run_dir), "--to", to, "--output", str(out), "-q", *extra]) == 0


def test_safetensors_round_trip(registry, demo_run, tmp_path):
    run_dir = demo_run
    _export(run_dir, "safetensors", tmp_path / "st")
    assert sorted(p.name for p in (tmp_path / "st").iterdir()) == [
        "config.json",
        "model.safetensors",
        "s2s_export.json",
        "vocab.json",
    ]
    meta = json.loads((tmp_path / "st" / "config.json").read_text())
    assert meta["model"]["d_model"] == 32 and meta["shared_vocab"] is True
    back = load_safetensors(tmp_path / "st")
    _, _, model = load_for_inference(
        run_dir, registry, ["run.device=cpu"]
    )  # the checkpoint the run tested
    src, tgt = (
        torch.randint(4, meta["src_vocab_size"], (3, 7)),
        torch.randint(4, meta["tgt_vocab_size"], (3, 5)),
    )
    assert torch.equal(back(src, tgt), model(src, tgt))
    assert back.out.weight is back.tgt_embed.weight is back.src_embed.weight  # still tied
    tested = json.loads((Path(run_dir) / "result.json").read_text())["checkpoint"]
    assert tested in (
        "checkpoint_average.pt",
        "checkpoint_best.pt",
    )  # the average of the last two, or the best
    assert torch.equal(
        checkpoint.load(Path(run_dir) / tested)["model"]["tgt_embed.weight"], back.tgt_embed.weight
    )


def test_export_errors_are_one_line(demo_run, tmp_path, capsys):
    run_dir = demo_run
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    cases = [
        (["safetensors", "--output", str(tmp_path / "full")], "is not empty"),
        (
            ["safetensors", "--output", str(tmp_path / "q"), "--quantization", "int8"],
            "ctranslate2 only",
        ),
        (
            ["ctranslate2", "--output", str(tmp_path / "q"), "--quantization", "int3"],
            "unknown quantization",
        ),
    ]
    for args, message in cases:
        assert main(["export", str(run_dir), "--to", *args, "-q"]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
    assert (
        main(
            [
                "export",
                str(run_dir),
                "--to",
                "safetensors",
                "--output",
                str(tmp_path / "full" / "x"),
            ]
        )
        == 2
    )
    assert "is a file" in capsys.readouterr().err
    assert (
        main(["export", str(tmp_path), "--to", "safetensors", "--output", str(tmp_path / "o")]) == 2
    )
    assert "not a run directory" in capsys.readouterr().err


@needs_ct2
def test_ctranslate2_greedy_equals_generate(registry, demo_run, tmp_path):
    import ctranslate2

    run_dir = demo_run
    _export(run_dir, "ctranslate2", tmp_path / "ct2")
    _export(run_dir, "ctranslate2", tmp_path / "ct2_int8", "--quantization", "int8")
    task, model, settings, sources, ours = _greedy(run_dir, registry)
    theirs = decode_ctranslate2(
        ctranslate2.Translator(str(tmp_path / "ct2")), Decoder(model, task, settings), sources
    )
    assert theirs == ours
    ends = [
        len(h) == int(settings.max_len_a * (len(s.split()) + 1) + settings.max_len_b)
        for h, s in zip(ours, sources)
    ]
    assert any(ends) and not all(ends)  # both ways a search ends: at EOS and at the maximum length
    # s2s generate --beam 1 itself, as text
    (tmp_path / "src.txt").write_text("\n".join(sources) + "\n")
    assert (
        main(
            [
                "generate",
                str(run_dir),
                "--input",
                str(tmp_path / "src.txt"),
                "--output",
                str(tmp_path / "hyp.txt"),
                "--beam",
                "1",
                "-q",
            ]
        )
        == 0
    )
    lines = (tmp_path / "hyp.txt").read_text().splitlines()
    assert lines == [task.postprocess(task.decode_target(h), s) for h, s in zip(theirs, sources)]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    to_ctranslate2(
        model, task, tmp_path / "again", quantization="int8"
    )  # the converter works on copies
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    int8 = decode_ctranslate2(
        ctranslate2.Translator(str(tmp_path / "ct2_int8")), Decoder(model, task, settings), sources
    )
    assert len(int8) == len(sources)
    # the position table (64 rows) stays fp32
    assert (tmp_path / "ct2_int8" / "model.bin").stat().st_size < 0.6 * (
        tmp_path / "ct2" / "model.bin"
    ).stat().st_size


@pytest.mark.slow
@needs_ct2
def test_ctranslate2_pre_norm(registry, tiny, tmp_path, capsys):
    """Pre-norm maps too (CTranslate2's final layer norms); MarianMT has no such form and refuses."""
    import ctranslate2

    run_dir = _train_demo(registry, tiny, "model.pre_norm=true")
    _export(run_dir, "ctranslate2", tmp_path / "ct2")
    task, model, settings, sources, ours = _greedy(run_dir, registry)
    assert (
        decode_ctranslate2(
            ctranslate2.Translator(str(tmp_path / "ct2")), Decoder(model, task, settings), sources
        )
        == ours
    )
    if importlib.util.find_spec("transformers") is not None:
        assert (
            main(
                [
                    "export",
                    str(run_dir),
                    "--to",
                    "huggingface",
                    "--output",
                    str(tmp_path / "ct2"),
                    "--force",
                ]
            )
            == 2
        )
        assert "pre_norm=true has no MarianMT form" in capsys.readouterr().err
        assert (
            tmp_path / "ct2" / "model.bin"
        ).is_file()  # a failed export leaves the folder as it was
        assert sorted(p.name for p in tmp_path.iterdir()) == [
            "cache",
            "ct2",
            "run",
        ]  # no temporary folder left


@needs_hf
def test_huggingface_greedy_equals_generate(registry, demo_run, tmp_path):
    from transformers import AutoTokenizer, MarianMTModel

    run_dir = demo_run
    _export(run_dir, "huggingface", tmp_path / "hf")
    task, model, settings, sources, ours = _greedy(run_dir, registry)
    hf = MarianMTModel.from_pretrained(str(tmp_path / "hf")).eval()
    assert decode_huggingface(hf, task, sources, settings) == ours
    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    assert tokenizer(sources[:5])["input_ids"] == [
        ids + [2] for ids in task.encode_source(sources[:5])
    ]
    plain = [h for h in ours if 3 not in h][
        :5
    ]  # the demo's decoder keeps <unk>, Hugging Face's drops it
    assert tokenizer.batch_decode(plain, skip_special_tokens=True) == [
        task.decode_target(h) for h in plain
    ]
    # the demo's word vocabulary is not one s2s imports back: refused in one line
    code = main(["import", str(tmp_path / "hf"), "--output", str(tmp_path / "again")])
    assert code == 2 and not (tmp_path / "again").exists()


def _parallel_text(tmp_path):
    """Tiny parallel files, source words reversed and upper-cased: two vocabularies."""
    import random

    rng = random.Random(0)
    words = "red green blue cat dog bird sees follows the a small big old".split()
    data = tmp_path / "text"
    data.mkdir()
    for split, n in (("train", 600), ("valid", 10), ("test", 60)):
        src = [" ".join(rng.choice(words) for _ in range(rng.randint(2, 7))) for _ in range(n)]
        (data / f"{split}.en").write_text("\n".join(src) + "\n")
        (data / f"{split}.de").write_text(
            "\n".join(" ".join(reversed(s.upper().split())) for s in src) + "\n"
        )
    return data


@needs_ct2
@needs_hf
def test_separate_subword_vocabularies(registry, tiny, tmp_path):
    """Byte-level BPE tokenizer.json files, one per side, through both exporters."""
    import ctranslate2
    from transformers import AutoTokenizer, MarianMTModel

    data = _parallel_text(tmp_path)
    cfg = load_config(
        "multi30k_en_de",
        tiny(
            f"task.data_dir={data}",
            "task.valid_prefix=valid",
            "task.test_prefix=test",
            "task.vocab_size=300",
            "task.shared_vocab=false",
            "optim.max_updates=40",
            "optim.warmup=10",
            "run.valid_interval=40",
            "run.save_interval=40",
            "data.max_tokens=600",
        ),
        registry=registry,
    )
    train(cfg, registry, quiet=True)
    task, model, settings, sources, ours = _greedy(cfg.run.dir, registry)
    _export(cfg.run.dir, "ctranslate2", tmp_path / "ct2")
    _export(cfg.run.dir, "huggingface", tmp_path / "hf")
    assert (
        decode_ctranslate2(
            ctranslate2.Translator(str(tmp_path / "ct2")), Decoder(model, task, settings), sources
        )
        == ours
    )
    assert (
        decode_huggingface(
            MarianMTModel.from_pretrained(str(tmp_path / "hf")), task, sources, settings
        )
        == ours
    )
    target = AutoTokenizer.from_pretrained(str(tmp_path / "hf" / "target_tokenizer"))
    assert target.batch_decode(ours[:5], skip_special_tokens=True) == [
        task.decode_target(h) for h in ours[:5]
    ]
    _imports_back_bitwise(cfg.run.dir, tmp_path / "hf", tmp_path / "again")


def _imports_back_bitwise(run_dir, exported, again):
    """`s2s import` of an s2s Hugging Face export: every parameter of the run's tested
    checkpoint bit for bit, and the run's task, model and decode sections."""
    from omegaconf import OmegaConf
    from s2s.core.apps.cli import main
    from s2s.core.runs.checkpoint import listed, load, tested

    assert main(["import", str(exported), "--output", str(again)]) == 0
    first, _ = tested(Path(run_dir))
    second = load(listed(again)[0])
    assert first["model"].keys() == second["model"].keys()
    assert all(torch.equal(first["model"][k], second["model"][k]) for k in first["model"])
    mine, theirs = (
        OmegaConf.load(Path(run_dir) / "config.yaml"),
        OmegaConf.load(again / "config.yaml"),
    )
    for section in ("model", "decode"):
        assert mine[section] == theirs[section]
    assert mine.task.tokenizer == theirs.task.tokenizer


@pytest.mark.slow
@needs(MULTI30K)
@needs_ct2
@needs_hf
def test_multi30k_exports_equal_generate(registry, tiny, tmp_path):
    """A model trained on a slice of Multi30k, decoded greedily on the whole test set."""
    import ctranslate2
    from transformers import MarianMTModel

    data = multi30k_slice(tmp_path / "m30k", {"train": 3000, "val": 20, "test_2016_flickr": 1000})
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
            "run.valid_interval=60",
            "run.save_interval=60",
            "run.valid_max_sentences=10",
        ),
        registry=registry,
    )
    train(cfg, registry, quiet=True)
    task, model, settings, sources, ours = _greedy(cfg.run.dir, registry)
    assert len(sources) == 1000
    _export(cfg.run.dir, "ctranslate2", tmp_path / "ct2")
    _export(cfg.run.dir, "huggingface", tmp_path / "hf")
    assert (
        decode_ctranslate2(
            ctranslate2.Translator(str(tmp_path / "ct2")), Decoder(model, task, settings), sources
        )
        == ours
    )
    assert (
        decode_huggingface(
            MarianMTModel.from_pretrained(str(tmp_path / "hf")), task, sources, settings
        )
        == ours
    )
