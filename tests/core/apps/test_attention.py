"""Table 3's knobs (model.d_k, model.d_v, model.positions=learned) through training, search,
export and resume, and `s2s attention`: maps drawn from the model's own forward pass.

One tiny demo run (heads of d_k = d_v = 8 where d_model / h is 16, learned positions) and one
tiny multi-task run, each trained once for the module.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from s2s.core.contract.task import DecodeDefaults
from conftest import task_keys, tiny_run
from omegaconf import OmegaConf
from s2s.core.apps.cli import main
from s2s.core.data.members import decode_settings
from s2s.core.data.nodes import prepare_data
from s2s.core.decode.batched import Decoder, source_batch
from s2s.core.decode.search import search
from s2s.core.errors import ExportError
from s2s.core.inference import load_for_inference
from s2s.core.setup.config import load_config
from s2s.core.setup.registry import Registry
from s2s.core.training.trainer import train

NEW = ["model.d_k=8", "model.d_v=8", "model.positions=learned"]
#: searches compared with recomputation or with exported models to 1e-4: fp32 on any CPU
FP32_SEARCH = "decode.precision=fp32"


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    return str(
        tiny_run(
            tmp_path_factory.mktemp("demo"),
            "demo",
            *NEW,
            FP32_SEARCH,
            "task.train_size=1000",
            "task.valid_size=10",
            "task.test_size=40",
            "optim.max_updates=120",
            "optim.warmup=40",
            "run.valid_interval=120",
            "run.save_interval=120",
            "model.max_positions=64",
            "data.max_len=64",
        )
    )


@pytest.fixture(scope="module")
def multitask_run(tmp_path_factory):
    return str(
        tiny_run(
            tmp_path_factory.mktemp("multi"),
            "multitask_demo",
            *task_keys("multitask_demo", "train_size=300", "valid_size=6", "test_size=6"),
            "data.max_tokens=300",
            FP32_SEARCH,
            "optim.warmup=10",
            "optim.max_updates=30",
            "run.valid_interval=30",
            "run.save_interval=30",
        )
    )


def _test_sources(run_dir, n, task=None):
    cfg, member, model = load_for_inference(run_dir, Registry.installed(), task=task)
    return cfg, member, model, prepare_data(member.task, cfg.data, quiet=True).texts("test")[0][:n]


def test_new_settings_train_and_search_incrementally_as_by_recomputing(demo_run):
    cfg, member, model, sources = _test_sources(demo_run, 40)
    assert (cfg.model.d_k, cfg.model.d_v, cfg.model.positions) == (8, 8, "learned")
    assert model.encoder[0].self_attn.w_q.weight.shape == (
        16,
        32,
    ) and model.pos_embed.weight.shape == (64, 32)
    records = [
        json.loads(line) for line in (Path(demo_run) / "metrics.jsonl").read_text().splitlines()
    ]
    losses = [r["loss"] for r in records if r["kind"] == "train"]
    assert records[-1]["update"] == 120 and losses[-1] < 0.7 * losses[0]
    settings = decode_settings(member, cfg.decode)
    src = source_batch(member.encode_source(sources))
    for beam in (1, 4):
        fast, slow = (
            search(
                model,
                src,
                DecodeDefaults(
                    beam=beam,
                    alpha=settings.alpha,
                    max_len_a=settings.max_len_a,
                    max_len_b=settings.max_len_b,
                ),
                incremental=inc,
            )
            for inc in (True, False)
        )
        assert [h.tokens for h in fast] == [h.tokens for h in slow]
        assert max(abs(a.score - b.score) for a, b in zip(fast, slow)) < 1e-4


def _maps(tmp_path, run_dir, lines, *args):
    (tmp_path / "src.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "maps"
    assert (
        main(
            [
                "attention",
                str(run_dir),
                "--input",
                str(tmp_path / "src.txt"),
                "--output",
                str(out),
                "-q",
                *args,
            ]
        )
        == 0
    )
    return out


def _check_png(path: Path) -> None:
    from matplotlib.image import imread

    assert path.stat().st_size > 15_000, path
    pixels = imread(path)
    assert pixels.shape[0] > 300 and pixels.shape[1] > 300 and pixels[..., :3].var() > 0.01, path


def _check_json(path: Path, kinds_layers_heads: dict) -> dict:
    record = json.loads(path.read_text(encoding="utf-8"))
    src, tgt = record["source_tokens"], record["decoder_input_tokens"]
    assert (
        tgt[0] == "<s>" and src[-1] == "</s>" and record["predicted_tokens"] == tgt[1:] + ["</s>"]
    )
    shapes = {
        "encoder": (len(src), len(src)),
        "decoder": (len(tgt), len(tgt)),
        "cross": (len(tgt), len(src)),
    }
    assert {
        k: {L: sorted(hs) for L, hs in v.items()} for k, v in record["attention"].items()
    } == kinds_layers_heads
    for kind, layers in record["attention"].items():
        for heads in layers.values():
            for w in map(np.array, heads.values()):
                assert w.shape == shapes[kind]
                assert np.abs(w.sum(1) - 1).max() < 1e-4 and w.min() >= 0
                if kind == "decoder":
                    assert np.triu(w, 1).max() == 0
    return record


def test_attention_maps_of_a_run(demo_run, tmp_path, registry):
    """Every layer, all heads on a page: 3 kinds x 2 layers per line, and a JSON whose hypothesis
    is what `s2s generate` searches (before post-processing)."""
    cfg, member, model, sources = _test_sources(demo_run, 2)
    out = _maps(tmp_path, demo_run, sources)
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == sorted(
        f"{n}.{k}.layer{L}.png"
        for n in (1, 2)
        for k in ("encoder", "decoder", "cross")
        for L in (1, 2)
    )
    for name in pngs[::3]:
        _check_png(out / name)
    every = {k: {"1": ["1", "2"], "2": ["1", "2"]} for k in ("encoder", "decoder", "cross")}
    records = [_check_json(out / f"{n}.json", every) for n in (1, 2)]
    searched = Decoder(
        model, member, decode_settings(member, cfg.decode), torch.device("cpu")
    ).generate(sources, postprocess=False)
    assert [r["hypothesis"] for r in records] == searched
    assert records[0]["source_tokens"] == sources[0].split() + ["</s>"]
    assert records[0]["decoder_input_tokens"][1:] == searched[0].split()


def test_attention_reads_its_input_as_generate_does(demo_run, tmp_path, registry, monkeypatch):
    """The task's prepare_source runs first (parsing: Penn Treebank tokens of raw text); the
    maps' source tokens are the prepared line's, the JSON's source the line as written."""
    from s2s.plugins.demo import DemoTask

    monkeypatch.setattr(
        DemoTask,
        "prepare_source",
        lambda self, lines: [" ".join(reversed(x.split())) for x in lines],
    )
    _, _, _, sources = _test_sources(demo_run, 1)
    record = json.loads((_maps(tmp_path, demo_run, sources, "--layer", "1") / "1.json").read_text())
    assert record["source"] == sources[0]
    assert record["source_tokens"] == sources[0].split()[::-1] + ["</s>"]


def test_one_layer_and_head_and_a_multitask_member(multitask_run, tmp_path, registry):
    """--task parse: the member's tokens, its task token first; --layer 2 --head 1: one map per kind."""
    cfg, member, model, sources = _test_sources(multitask_run, 2, task="parse")
    out = _maps(
        tmp_path,
        multitask_run,
        sources,
        "--task",
        "parse",
        "--layer",
        "2",
        "--head",
        "1",
        "--beam",
        "2",
    )
    assert sorted(p.name for p in out.glob("*.png")) == sorted(
        f"{n}.{k}.layer2.head1.png" for n in (1, 2) for k in ("encoder", "decoder", "cross")
    )
    _check_png(out / "1.cross.layer2.head1.png")
    record = _check_json(out / "1.json", {k: {"2": ["1"]} for k in ("encoder", "decoder", "cross")})
    assert record["source_tokens"] == ["<parse>", *sources[0].split(), "</s>"]
    settings = decode_settings(member, OmegaConf.merge(cfg.decode, {"beam": 2}))
    assert (
        record["hypothesis"]
        == Decoder(model, member, settings, torch.device("cpu")).generate(
            sources[:1], postprocess=False
        )[0]
    )


def test_attention_command_errors_are_one_line(demo_run, multitask_run, tmp_path, capsys):
    (tmp_path / "src.txt").write_text("a b\n")
    cases = [
        ([demo_run, "--layer", "3"], "--layer 3: this model has 2"),
        ([demo_run, "--head", "0"], "--head 0: this model has 2"),
        ([multitask_run], "choose one with --task"),
        ([demo_run, "--output", demo_run], "is a run directory"),
        ([demo_run, "--beam", "0"], "--beam 0: at least 1"),
    ]
    for args, message in cases:
        argv = ["attention", *args, "--input", str(tmp_path / "src.txt")]
        assert main(argv + ([] if "--output" in args else ["--output", str(tmp_path / "o")])) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err


# -- export --------------------------------------------------------------------------------------
def test_safetensors_round_trip_keeps_the_new_settings(demo_run, tmp_path, registry):
    from s2s.core.inference.formats.safetensors import load_safetensors

    assert (
        main(["export", demo_run, "--to", "safetensors", "--output", str(tmp_path / "st"), "-q"])
        == 0
    )
    meta = json.loads((tmp_path / "st" / "config.json").read_text())
    assert {k: meta["model"][k] for k in ("d_k", "d_v", "positions")} == {
        "d_k": 8,
        "d_v": 8,
        "positions": "learned",
    }
    back = load_safetensors(tmp_path / "st")
    _, _, model = load_for_inference(demo_run, registry)
    assert torch.equal(back.pos_embed.weight, model.pos_embed.weight)
    src, tgt = (
        torch.randint(4, meta["src_vocab_size"], (3, 7)),
        torch.randint(4, meta["tgt_vocab_size"], (3, 5)),
    )
    assert torch.equal(back(src, tgt), model(src, tgt))


@pytest.mark.skipif(
    importlib.util.find_spec("ctranslate2") is None, reason="ctranslate2 is not installed"
)
def test_ctranslate2_takes_the_head_width_and_learned_positions(demo_run, tmp_path, registry):
    import ctranslate2
    from s2s.core.inference.deployed import decode_ctranslate2

    assert (
        main(["export", demo_run, "--to", "ctranslate2", "--output", str(tmp_path / "ct2"), "-q"])
        == 0
    )
    cfg, member, model, sources = _test_sources(demo_run, 40)
    settings = decode_settings(member.task, OmegaConf.merge(cfg.decode, {"beam": 1}))
    ours = search(
        model,
        source_batch(member.encode_source(sources)),
        DecodeDefaults(
            beam=1, alpha=settings.alpha, max_len_a=settings.max_len_a, max_len_b=settings.max_len_b
        ),
    )
    theirs = decode_ctranslate2(
        ctranslate2.Translator(str(tmp_path / "ct2")),
        Decoder(model, member.task, settings),
        sources,
    )
    assert theirs == [h.tokens for h in ours]


def test_formats_refuse_what_they_cannot_express_naming_the_setting(demo_run, tmp_path, registry):
    from s2s.core.inference.formats.ctranslate2 import to_ctranslate2
    from s2s.core.inference.formats.huggingface import to_huggingface
    from s2s.core.nn.model import Transformer
    from s2s.core.setup.settings import ModelConfig

    cfg, member, model = load_for_inference(demo_run, registry)
    if importlib.util.find_spec("transformers") is not None:
        with pytest.raises(ExportError, match=r"^model\.positions=learned has no MarianMT form"):
            to_huggingface(model, cfg, member.task, tmp_path)
        sinusoid = OmegaConf.merge(cfg, {"model": {"positions": "sinusoid"}})
        with pytest.raises(
            ExportError, match=r"^model\.d_k=8 has no MarianMT form .* --to ctranslate2"
        ):
            to_huggingface(model, sinusoid, member.task, tmp_path)
    if importlib.util.find_spec("ctranslate2") is not None:
        uneven = Transformer(
            ModelConfig(layers=1, d_model=16, d_ff=32, heads=2, d_k=4, d_v=12), 20, 20, True
        )
        with pytest.raises(
            ExportError, match=r"^model\.d_k=4 with model\.d_v=12 has no CTranslate2 form"
        ):
            to_ctranslate2(uneven, None, tmp_path)
    assert not any(tmp_path.iterdir())


# -- resume --------------------------------------------------------------------------------------
@pytest.mark.slow
def test_sigkill_then_resume_is_bitwise_identical_with_the_new_settings(
    tmp_path, registry, monkeypatch
):
    """test_resume's SIGKILL test with heads of d_k = 4, d_v = 12 (the cache pads) and learned positions."""
    import test_resume as r

    extra = ["model.d_k=4", "model.d_v=12", "model.positions=learned"]
    real = r._overrides
    monkeypatch.setattr(r, "_overrides", lambda *a, **k: [*real(*a, **k), *extra])
    cache = tmp_path / "cache"
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    for d in (whole, broken):
        d.mkdir()
    train(load_config("demo", r._overrides(whole, cache), registry=registry), registry, quiet=True)
    r._kill_after(r._launch(broken, cache, 1, "killed"), broken, "killed", r.KILL_AT)
    r._finish(r._launch(broken, cache, 1, "resumed"), broken, "resumed")
    a, b = (r.checkpoint.load(r.checkpoint.listed(d)[-1]) for d in (whole, broken))
    assert a["update"] == b["update"] == r.UPDATES and "pos_embed.weight" in a["model"]
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    for i, sa in a["optimizer"]["state"].items():
        for key, value in sa.items():
            assert torch.equal(value, b["optimizer"]["state"][i][key]), (i, key)
