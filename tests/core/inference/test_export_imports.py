"""`s2s export --to ctranslate2` of imports: an OPUS-MT import (sentencepiece pieces, swish, a
final logits bias), a fairseq import (Moses + BPE, fairseq's sinusoids as a table), an NLLB
import (pre-norm with final norms, offset sinusoids, language codes: the source's prefixed, the
target's forced as CTranslate2's target_prefix) and an M2M100 import (its `__de__` codes and
made-up words). CTranslate2's greedy search over the export gives `s2s generate --beam 1`'s
tokens, line for line (bench/interop/ct2_imports.py: all 1,000 test sources, and beam 4's
BLEU).

The models are built here at small sizes with random weights drawn so that outputs are not
near-ties, as the import's tests build theirs."""

from __future__ import annotations

import importlib.util
import json

import pytest
from conftest import MULTI30K, corpus

pytestmark = pytest.mark.skipif(
    any(
        importlib.util.find_spec(m) is None
        for m in ("ctranslate2", "transformers", "sentencepiece", "sacremoses", "subword_nmt")
    ),
    reason="ctranslate2, transformers, sentencepiece, sacremoses and subword-nmt are needed",
)

LINES = 30  # test sources a direction (bench/interop/ct2_imports.py: all 1,000)
NLLB = {"en": "eng_Latn", "de": "deu_Latn", "fr": "fra_Latn"}


@pytest.fixture(scope="module")
def imports(tmp_path_factory):
    """{kind: (run directory, CTranslate2 export)} and the test lines by language."""
    from fairseq_fixture import build_fairseq
    from m2m100_fixture import build_m2m100
    from opus_mt_fixture import build_opus_mt

    from s2s.core.apps.cli import main

    root = corpus(MULTI30K)
    train = {
        lang: (root / f"train.{lang}").read_text(encoding="utf-8").splitlines()[:2000]
        for lang in ("en", "de", "fr")
    }
    test = {
        lang: (root / f"test_2016_flickr.{lang}").read_text(encoding="utf-8").splitlines()[:LINES]
        for lang in ("en", "de")
    }
    tmp = tmp_path_factory.mktemp("ct2_imports")
    folders = {
        "opus_mt": (
            build_opus_mt(
                tmp / "opus", train["en"], train["de"], vocab_size=400, d_model=32, eos_bias=4.0
            ),
            [],
        ),
        "fairseq": (
            build_fairseq(
                tmp / "fairseq",
                train["en"],
                train["de"],
                merges=400,
                d_model=32,
                eos_scale=4.0,
                max_positions=64,
            ),
            [],
        ),  # fmt: skip
        "nllb": (
            build_m2m100(
                tmp / "nllb",
                train["en"] + train["de"] + train["fr"],
                "nllb",
                vocab_size=500,
                d_model=32,
                decoder_layers=1,
                max_length=24,
                eos_scale=6.0,
            ),
            ["--src-lang", NLLB["en"], "--tgt-lang", NLLB["de"]],
        ),  # fmt: skip
        "m2m100": (
            build_m2m100(
                tmp / "m2m100",
                train["en"] + train["de"] + train["fr"],
                "m2m100",
                vocab_size=500,
                d_model=32,
                decoder_layers=1,
                max_length=24,
                eos_scale=3.0,
            ),
            ["--src-lang", "en", "--tgt-lang", "de"],
        ),  # fmt: skip
    }
    found = {}
    for kind, (folder, langs) in folders.items():
        run, export = tmp / f"run_{kind}", tmp / f"ct2_{kind}"
        assert main(["import", str(folder), "--output", str(run), "-q", *langs]) == 0
        assert main(["export", str(run), "--to", "ctranslate2", "--output", str(export), "-q"]) == 0
        found[kind] = run, export
    return found, test, tmp


def greedy_both(run, export, lines, langs=()):
    """(s2s's greedy ids, CTranslate2's over the export, the run's decoder) of `lines`, in the
    direction `langs` names (--src-lang S --tgt-lang T) or the run's own."""
    import ctranslate2

    from s2s.core.inference import load_run
    from s2s.core.inference.deployed import decode_ctranslate2

    overrides = ["decode.beam=1", "run.device=cpu", "decode.precision=fp32"]
    if langs:
        overrides += [f"decode.src_lang={langs[1]}", f"decode.tgt_lang={langs[3]}"]
    ours = [o[0].tokens for o in load_run(run, overrides).decoder.candidates(lines)]
    decoder = load_run(run, overrides[:3]).decoder  # the run's own languages
    named = dict(src_lang=langs[1], tgt_lang=langs[3]) if langs else {}
    theirs = decode_ctranslate2(ctranslate2.Translator(str(export)), decoder, lines, **named)
    return ours, theirs, decoder


def generate_lines(run, lines, tmp, langs=()):
    """`s2s generate RUN --beam 1 [--src-lang S --tgt-lang T]`'s lines."""
    from s2s.core.apps.cli import main

    source, out = tmp / "in.txt", tmp / "out.txt"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    argv = ["generate", str(run), "--input", str(source), "--output", str(out), "--beam", "1"]
    assert main([*argv, *langs, "decode.precision=fp32", "-q"]) == 0
    return out.read_text(encoding="utf-8").splitlines()


@pytest.mark.parametrize("kind", ["opus_mt", "fairseq", "nllb", "m2m100"])
def test_ctranslate2_greedy_equals_generate(imports, kind, tmp_path):
    (run, export), test = imports[0][kind], imports[1]
    ours, theirs, decoder = greedy_both(run, export, test["en"])
    assert theirs == ours
    lengths = {len(h) for h in ours}
    assert len(lengths) > 1 and sum(map(bool, ours)) > len(ours) / 2  # most not empty
    task = decoder.task
    texts = [task.postprocess(task.decode_target(h), s) for h, s in zip(theirs, test["en"])]
    assert generate_lines(run, test["en"], tmp_path) == texts


def test_nllb_in_two_directions(imports, tmp_path):
    """One export serves every direction: the source's code among its tokens, the target's as
    CTranslate2's target_prefix, chosen as --src-lang / --tgt-lang choose them."""
    (run, export), test = imports[0]["nllb"], imports[1]
    for src, tgt in (("en", "de"), ("de", "fr"), ("de", "en")):
        langs = ("--src-lang", NLLB[src], "--tgt-lang", NLLB[tgt])
        ours, theirs, decoder = greedy_both(run, export, test[src], langs)
        assert theirs == ours, (src, tgt)
        task, vocab = decoder.task, decoder.task.task.tgt_vocab
        assert all(h[0] == vocab.stoi[NLLB[tgt]] for h in theirs)  # the code first, as s2s's
        assert vocab.lang == NLLB["de"]  # the run's own language again after
        texts = [task.postprocess(task.decode_target(h), s) for h, s in zip(theirs, test[src])]
        assert generate_lines(run, test[src], tmp_path, langs) == texts


def test_the_export_holds_what_decodes_it(imports):
    """The vocabularies are the import's tokens in id order, each its own name; the import's
    vocabulary files (the sentencepiece model, the languages) lie beside model.bin."""
    from s2s.core.inference.formats.common import task_tokens
    from s2s.core.inference import load_run

    for kind, (run, export) in imports[0].items():
        files = {p.name for p in export.iterdir()}
        task = load_run(run, ["run.device=cpu"]).task
        tokens = json.loads((export / "shared_vocabulary.json").read_text(encoding="utf-8"))
        assert tokens == task_tokens(task)[0] and len(set(tokens)) == len(tokens)
        assert {"model.bin", "config.json"} <= files
        if kind == "fairseq":
            assert {"moses_bpe.src.json", "moses_bpe.tgt.json"} <= files
        else:
            assert {"pieces.src.json", "pieces.tgt.json"} <= files
    pieces = json.loads((imports[0]["nllb"][1] / "pieces.tgt.json").read_text(encoding="utf-8"))
    assert pieces["lang"] == NLLB["de"] and NLLB["fr"] in pieces["languages"]


def test_a_language_not_in_the_model_is_one_line(imports):
    import ctranslate2

    from s2s.core.errors import ConfigError
    from s2s.core.inference import load_run
    from s2s.core.inference.deployed import decode_ctranslate2

    (run, export), test = imports[0]["nllb"], imports[1]
    decoder = load_run(run, ["run.device=cpu", "decode.beam=1"]).decoder
    translator = ctranslate2.Translator(str(export))
    with pytest.raises(ConfigError, match="fra_Latm.*nearest: fra_Latn") as e:
        decode_ctranslate2(translator, decoder, test["en"][:2], tgt_lang="fra_Latm")
    assert "\n" not in str(e.value)
    assert decoder.task.task.tgt_vocab.lang == NLLB["de"]  # left as it was


def test_a_token_spelled_as_an_earlier_one_gets_a_name_of_its_own():
    """CTranslate2 names every id by its token: a model's own "<s>" after s2s's specials (a
    vocabulary may hold one) is told apart, and each name maps back to its id."""
    from types import SimpleNamespace

    from s2s.core.inference.formats.common import task_tokens
    from s2s.core.tokenizers import SPECIALS
    from s2s.core.tokenizers.moses_bpe import MosesBPE

    tokens = [*SPECIALS, "<bos>", "Haus", "<s>", "<s>#6", "</s>"]
    vocab = MosesBPE("de", "#version: 0.2\nH a\n", tokens, [1, -1, 2, 3, 0, 4, 5, 6, 7])
    src, tgt = task_tokens(SimpleNamespace(src_vocab=vocab, tgt_vocab=vocab))
    assert src == tgt and src[:6] == tokens[:6] and len(set(src)) == len(src) == len(tokens)
    assert src[6:] == ["<s>#6", "<s>#6#7", "</s>#8"]
