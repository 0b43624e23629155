"""`s2s import` of NLLB-200- and M2M100-shaped models (transformers' M2M100ForConditionalGeneration
at small sizes, sentencepiece trained on Multi30k's English, German and French): ids are
NllbTokenizer's / M2M100Tokenizer's, `s2s generate --src-lang --tgt-lang` decodes as
transformers' `generate` with the target's code forced, and what cannot be used is refused in
one line with nothing written."""

import importlib.util
import json
import re
import shutil

import pytest
from cli_checks import fails, s2s, snapshot
from conftest import MULTI30K, corpus

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("transformers", "sentencepiece", "google")),
    reason="transformers, sentencepiece and protobuf are not installed",
)

LINES = 10  # test sources compared a direction (bench/interop/nllb_import.py: all 1,000)
LAYOUTS = {
    "nllb": ("eng_Latn", "deu_Latn", "fra_Latn"),
    "m2m100": ("en", "de", "fr"),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """{layout: (folder, run directory)} and the test lines (English, German)."""
    from m2m100_fixture import build_m2m100

    from s2s.core.apps.cli import main

    root = corpus(MULTI30K)
    train = []
    for lang in ("en", "de", "fr"):
        train += (root / f"train.{lang}").read_text(encoding="utf-8").splitlines()[:2000]
    tmp = tmp_path_factory.mktemp("m2m100")
    found = {}
    for layout, (en, de, _) in LAYOUTS.items():
        # random weights, </s> scaled: outputs that end, decoded in seconds
        folder = build_m2m100(
            tmp / layout, train, layout, vocab_size=500, d_model=32, decoder_layers=1,
            max_length=24, eos_scale={"nllb": 3.5, "m2m100": 2.5}[layout],
        )  # fmt: skip
        run = tmp / f"run_{layout}"
        argv = ["import", str(folder), "--output", str(run), "--src-lang", en, "--tgt-lang", de]
        assert main(argv) == 0
        found[layout] = folder, run
    test = {
        lang: (root / f"test_2016_flickr.{lang}").read_text(encoding="utf-8").splitlines()[:LINES]
        for lang in ("en", "de")
    }
    return found, test, tmp


def without_code(line: str) -> str:
    """M2M100Tokenizer's decode keeps language codes (__de__) in the text, s2s's leaves them
    out as NllbTokenizer's does: left out."""
    return re.sub(r"__[a-z]+__", "", line).strip()


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_ids_are_the_tokenizers(models, layout):
    from m2m100_fixture import hf_ids, s2s_ids

    (folder, run), test = models[0][layout], models[1]
    lines = test["en"] + ["", "Ünïcödé — «quotes» and    spaces", "x" * 40]
    for lang, lines in ((LAYOUTS[layout][0], lines), (LAYOUTS[layout][1], test["de"])):
        assert s2s_ids(run, lines, lang) == hf_ids(folder, lines, lang)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_generate_equals_transformers_in_two_directions(models, layout, tmp_path):
    from m2m100_fixture import hf_generate, s2s_generate

    (folder, run), test = models[0][layout], models[1]
    en, de, fr = LAYOUTS[layout]
    for src, tgt, lines in ((en, de, test["en"]), (de, fr, test["de"])):
        source = tmp_path / "in.txt"
        source.write_text("\n".join(lines) + "\n", encoding="utf-8")
        for beam in (1, 4):
            ours = s2s_generate(run, source, src, tgt, beam)
            theirs = [without_code(h) for h in hf_generate(folder, lines, src, tgt, beam)]
            assert ours == theirs, (src, tgt, beam)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_huggingface_export_is_its_own_class_and_decodes_as_the_run(models, layout, capsys):
    """`s2s export --to huggingface` of an import writes an M2M100ForConditionalGeneration with
    NllbTokenizer's / M2M100Tokenizer's files: transformers' greedy output of the export (the
    target's code forced) equals `s2s generate --beam 1` on 30 lines in two directions, and
    `s2s import` of the export decodes as the run again."""
    from m2m100_fixture import hf_generate, s2s_generate
    from transformers import AutoTokenizer

    (_, run), tmp = models[0][layout], models[2]
    en, de, fr = LAYOUTS[layout]
    out = tmp / f"hf_{layout}"
    assert s2s(capsys, "export", run, "--to", "huggingface", "--output", out)[0] == 0
    saved = json.loads((out / "config.json").read_text(encoding="utf-8"))
    assert saved["architectures"] == ["M2M100ForConditionalGeneration"]
    tokenizer = type(AutoTokenizer.from_pretrained(str(out))).__name__
    assert (
        tokenizer.removesuffix("Fast")
        == {"nllb": "NllbTokenizer", "m2m100": "M2M100Tokenizer"}[layout]
    )
    again = tmp / f"hf_{layout}_run"
    argv = ["import", out, "--output", again, "--src-lang", en, "--tgt-lang", de]
    assert s2s(capsys, *argv)[0] == 0
    root = corpus(MULTI30K)
    for src, tgt, lang in ((en, de, "en"), (de, fr, "de")):
        lines = (root / f"test_2016_flickr.{lang}").read_text(encoding="utf-8").splitlines()[:30]
        source = tmp / f"export_in.{lang}"
        source.write_text("\n".join(lines) + "\n", encoding="utf-8")
        ours = s2s_generate(run, source, src, tgt, 1)
        assert [without_code(h) for h in hf_generate(out, lines, src, tgt, 1)] == ours, (src, tgt)
        assert s2s_generate(again, source, src, tgt, 1) == ours, (src, tgt)


def test_rerank_in_a_direction_of_its_own(models, capsys):
    """`s2s rerank --src-lang --tgt-lang`: the run and its --with scorer translate English to
    French, its --reverse scorer (the same import) French to English; with zero weights the
    output is the search's best, as `s2s generate --beam N` in that direction gives it. A
    language the model lacks is one line naming the nearest, with nothing written."""
    from m2m100_fixture import s2s_generate

    (_, run), test, tmp = models[0]["nllb"], models[1], models[2]
    source, output = tmp / "rerank.en", tmp / "rerank.fr"
    source.write_text("\n".join(test["en"][:4]) + "\n", encoding="utf-8")
    argv = ["rerank", run, "--input", source, "--output", output, "--nbest", "3"]
    argv += ["--with", run, "--reverse", run, "--src-lang", "eng_Latn", "--tgt-lang", "fra_Latn"]
    code, _, err = s2s(capsys, *argv, "--weights", "0,0")
    assert code == 0, err
    best = s2s_generate(run, source, "eng_Latn", "fra_Latn", 3)
    assert output.read_text(encoding="utf-8").splitlines() == best
    code, _, err = s2s(capsys, *argv, "--weights", "1,1")
    assert code == 0 and len(output.read_text(encoding="utf-8").splitlines()) == 4, err
    output.unlink()
    bad = [a if a != "fra_Latn" else "fra_latn" for a in argv]
    got = s2s(capsys, *bad, "--weights", "1,1")
    fails(got, snapshot(run, source, output), "'fra_latn'", "fra_Latn")
    assert not output.exists()


def test_the_run_records_the_options_and_languages(models):
    from omegaconf import OmegaConf

    from s2s.core.runs.checkpoint import listed, load

    folder, run = models[0]["nllb"]
    cfg = OmegaConf.load(run / "config.yaml")
    assert cfg.model.pre_norm and cfg.model.positions == "offset_sinusoid"
    assert cfg.model.scale_embedding and (cfg.model.encoder_layers, cfg.model.decoder_layers) == (
        2,
        1,
    )
    assert (cfg.decode.src_lang, cfg.decode.tgt_lang) == ("eng_Latn", "deu_Latn")
    assert cfg.origin.format == "nllb" and cfg.origin.training.encoder_layerdrop == 0.05
    saved = load(listed(run)[0])["config"]["model"]
    assert saved["positions"] == "offset_sinusoid" and saved["decoder_layers"] == 1
    pieces = json.loads((run / "pieces.src.json").read_text(encoding="utf-8"))
    assert len(pieces["languages"]) == 202 and pieces["lang"] == "eng_Latn"
    assert OmegaConf.load(models[0]["m2m100"][1] / "config.yaml").origin.format == "m2m100"


def test_bad_input_is_one_line_and_writes_nothing(models, capsys):
    (folder, run), test, tmp = models[0]["nllb"], models[1], models[2]
    out = tmp / "bad" / "run"
    out.parent.mkdir(exist_ok=True)

    def copy(name, edit):
        where = tmp / name
        shutil.rmtree(where, ignore_errors=True)
        shutil.copytree(folder, where)
        cfg = json.loads((where / "config.json").read_text())
        (where / "config.json").write_text(json.dumps(edit(cfg)))
        return where

    for name, edit, needles in (
        ("unknown", lambda c: {**c, "rope_theta": 10000.0}, ("config.json", "rope_theta")),
        ("fewer_rows", lambda c: {**c, "vocab_size": 600}, ("vocab_size=600", "language list")),
    ):
        where = copy(name, edit)
        got = s2s(capsys, "import", where, "--output", out, "--tgt-lang", "deu_Latn")
        fails(got, snapshot(where, out.parent), *needles)
    from safetensors.torch import load_file, save_file

    weights = load_file(str(folder / "model.safetensors"))
    fc1 = next(k for k in weights if k.endswith("encoder.layers.0.fc1.weight"))
    for name, tensor, needles in (
        ("nan", weights[fc1].clone().fill_(float("nan")), ("NaN or infinite",)),
        ("wider", weights[fc1].new_zeros(weights[fc1].shape[0], weights[fc1].shape[1] + 1), ("shape",)),
    ):  # fmt: skip
        where = copy(f"weights_{name}", lambda c: c)
        save_file({**weights, fc1: tensor}, str(where / "model.safetensors"))
        got = s2s(capsys, "import", where, "--output", out, "--tgt-lang", "deu_Latn")
        fails(got, snapshot(where, out.parent), fc1.removeprefix("model."), *needles)
    fails(
        s2s(
            capsys, "import", folder, "--output", out, "--src-lang", "eng_Latn", "--tgt-lang", "xx"
        ),
        snapshot(folder, out.parent),
        "--tgt-lang",
        "'xx'",
    )
    source = tmp / "in.en"
    source.write_text("\n".join(test["en"][:3]) + "\n", encoding="utf-8")
    output = tmp / "out.de"
    before = snapshot(run, source, tmp / "bad")
    got = s2s(capsys, "generate", run, "--input", source, "--output", output, "--tgt-lang",
              "fra_latn")  # fmt: skip
    fails(got, before, "decode.tgt_lang", "'fra_latn'", "fra_Latn")
    assert not output.exists()
    source.write_text("A dog.\nfra_Latn A cat runs.\n", encoding="utf-8")
    before = snapshot(run, source, tmp / "bad")
    got = s2s(capsys, "generate", run, "--input", source, "--output", output)
    fails(got, before, f"{source}, line 2", "'fra_Latn'", "--tgt-lang")
    assert not output.exists()


def test_a_model_without_languages_refuses_them(tmp_path, capsys):
    """--tgt-lang on a run whose vocabulary has no language codes (any run s2s trained)."""
    from conftest import TINY_MODEL

    run = tmp_path / "run"
    argv = ["train", "demo", "-q", *TINY_MODEL, "task.train_size=200", "optim.max_updates=1"]
    assert s2s(capsys, *argv, f"run.dir={run}", f"data.cache_dir={tmp_path / 'c'}")[0] == 0
    source = tmp_path / "in.txt"
    source.write_text("a b\n", encoding="utf-8")
    before = snapshot(run, source)
    got = s2s(capsys, "generate", run, "--input", source, "--tgt-lang", "de")
    fails(got, before, "decode.tgt_lang", "no language codes")


@pytest.mark.slow
def test_fine_tuning_an_import_keeps_its_languages(models, capsys):
    """`s2s train finetune_translation run.init_from=NLLB_IMPORT` on English-German trains with
    the import's vocabulary and languages (targets start with deu_Latn's code, as NLLB's
    training did), and the tuned run still decodes into another language (--tgt-lang). The
    import's output bias (zero, BOS's -inf) is held as imported (model.output_bias_fixed, carried
    to the fine-tune), so the tuned run exports back into M2M100's class and transformers decodes
    it as s2s does; trained (model.output_bias_fixed=false), the export is refused in one line."""
    from m2m100_fixture import hf_generate, s2s_generate
    from s2s.core.tokenizers.pieces import Pieces

    (_, run), tmp = models[0]["nllb"], models[2]
    root, data = corpus(MULTI30K), tmp / "ft_data"
    data.mkdir(exist_ok=True)
    for split, name, n in (("train", "train", 300), ("valid", "val", 20), ("test", "val", 20)):
        for lang in ("en", "de"):
            lines = (root / f"{name}.{lang}").read_text(encoding="utf-8").splitlines()[:n]
            (data / f"{split}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp / "ft"
    args = [f"run.init_from={run}", f"task.data_dir={data}", f"data.cache_dir={tmp / 'ftc'}"]
    args += [f"run.dir={out}", "optim.max_updates=4", "run.valid_interval=2", "-q"]
    args += ["run.save_interval=2", "decode.max_len_b=10", "run.threads=1"]
    code, _, err = s2s(capsys, "train", "finetune_translation", *args)
    assert code == 0, err
    for side in ("src", "tgt"):
        assert (out / f"pieces.{side}.json").read_bytes() == (
            run / f"pieces.{side}.json"
        ).read_bytes()
    tgt = Pieces.load(out / "pieces.tgt.json")
    assert tgt.lang == "deu_Latn" and tgt.encode(["Ein Hund."])[0][0] == tgt.stoi["deu_Latn"]
    source = tmp / "ft_in.en"
    source.write_text("A dog runs.\n", encoding="utf-8")
    code, output, err = s2s(capsys, "generate", out, "--input", source, "--tgt-lang", "fra_Latn")
    assert code == 0 and len(output.splitlines()) == 1, err
    exported = tmp / "ft_hf"
    assert s2s(capsys, "export", out, "--to", "huggingface", "--output", exported)[0] == 0
    lines = (root / "test_2016_flickr.en").read_text(encoding="utf-8").splitlines()[:10]
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    ours = s2s_generate(out, source, "eng_Latn", "deu_Latn", 1)
    theirs = hf_generate(exported, lines, "eng_Latn", "deu_Latn", 1)
    assert [without_code(h) for h in theirs] == ours

    # trained, the bias has no place in M2M100's class
    trained = tmp / "ft_bias"
    args = [a for a in args if not a.startswith("run.dir=")] + [f"run.dir={trained}"]
    code, _, err = s2s(
        capsys, "train", "finetune_translation", *args, "model.output_bias_fixed=false"
    )
    assert code == 0, err
    refused = tmp / "ft_bias_hf"
    got = s2s(capsys, "export", trained, "--to", "huggingface", "--output", refused)
    fails(got, snapshot(trained, refused), "output bias is not zero", "--to ctranslate2")
    assert not refused.exists()


def test_one_server_many_directions(models, tmp_path):
    """POST /generate with "tgt_lang" (and "src_lang"): each request decoded into its language,
    as `s2s generate --tgt-lang` decodes it; a language the model lacks is a 400 naming the
    nearest; a code typed into the text a 400."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "apps"))
    from m2m100_fixture import s2s_generate
    from test_serve import post, server

    (_, run), test = models[0]["nllb"], models[1]
    lines = test["en"][:3]
    source = tmp_path / "in.en"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with server(run, "decode.beam=2", log=tmp_path / "serve.log") as url:
        for tgt in ("fra_Latn", "deu_Latn"):
            status, answer = post(url + "/generate", {"text": lines, "tgt_lang": tgt})
            assert status == 200, answer
            assert answer["hypotheses"] == s2s_generate(run, source, "eng_Latn", tgt, 2)
        status, answer = post(url + "/generate", {"text": lines, "tgt_lang": "fra_latn"})
        assert status == 400 and "fra_Latn" in answer["error"], answer
        status, answer = post(url + "/generate", {"text": ["deu_Latn A dog."]})
        assert status == 400 and "'deu_Latn'" in answer["error"], answer
