"""Translation scores: sacreBLEU exactly, the paper's tokenised BLEU by hand, chrF, bad input."""

from __future__ import annotations

import math
import random

import pytest
import sacrebleu
from conftest import MULTI30K, corpus
from omegaconf import OmegaConf
from s2s.core.errors import DataError
from s2s.plugins.translation import TranslationConfig, TranslationTask, metrics
from s2s.plugins.translation.moses import split_compounds, tokenize


def _task(**kw):
    return TranslationTask(OmegaConf.merge(OmegaConf.structured(TranslationConfig), kw))


def _edits(refs: list[str]) -> dict[str, list[str]]:
    """Hypotheses of decreasing quality made from the references."""
    rng = random.Random(7)
    drop = [" ".join(w for j, w in enumerate(r.split()) if j % 4 != 3) for r in refs]
    swap = []
    for r in refs:
        w = r.split()
        if len(w) > 3:
            i = rng.randrange(len(w) - 1)
            w[i], w[i + 1] = w[i + 1], w[i]
        swap.append(" ".join(w))
    shuffled = refs[1:] + refs[:1]
    return {
        "identical": list(refs),
        "lowercased": [r.lower() for r in refs],
        "every_4th_word_dropped": drop,
        "one_swap": swap,
        "misaligned": shuffled,
        "truncated": [r[: len(r) // 2] for r in refs],
        "empty": [""] * len(refs),
    }


@pytest.fixture(scope="module")
def references() -> list[str]:
    return (
        corpus(MULTI30K / "test_2016_flickr.de").read_text(encoding="utf-8").splitlines()[:400]
    )  # 400 of 1,000 lines: faster, as telling


def test_bleu_and_chrf_equal_sacrebleu_on_hypothesis_files(references, tmp_path):
    task = _task(tgt_lang="de")
    seen = set()
    for name, hyps in _edits(references).items():
        path = tmp_path / f"{name}.de"
        path.write_text("\n".join(hyps) + "\n", encoding="utf-8")
        hyps = path.read_text(encoding="utf-8").splitlines()
        score = task.score(hyps, references)
        expected = sacrebleu.corpus_bleu(hyps, [references])
        assert abs(score.value - expected.score) < 0.01, name
        assert (
            abs(score.figures["chrf"] - sacrebleu.corpus_chrf(hyps, [references]).score) < 0.01
        ), name
        assert score.figures["sentences"] == len(references)
        seen.add(round(score.value, 1))
    assert len(seen) == 7 and 100.0 in seen and 0.0 in seen


def test_score_fields_and_signatures(references):
    hyps = _edits(references)["one_swap"]
    d = _task(tgt_lang="de").score(hyps, references).as_dict()
    assert {
        "bleu",
        "bleu_tok",
        "chrf",
        "sentences",
        "signature",
        "bleu_signature",
        "chrf_signature",
        "bleu_tok_signature",
    } <= set(d)
    assert d["signature"] == d["bleu_signature"]
    assert d["signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    assert (
        "tok:moses-de+atat" in d["bleu_tok_signature"] and "smooth:none" in d["bleu_tok_signature"]
    )
    assert d["bleu_tok"] != d["bleu"] and d["bleu"] > 50  # other tokens, another figure


def test_bleu_tok_by_hand_with_a_hyphenated_compound():
    ref, hyp = "Die Nord-Süd-Achse ist lang.", "Die Nord-Achse ist lang."
    # ref: Die Nord ##AT##-##AT## Süd ##AT##-##AT## Achse ist lang .   (9 tokens)
    # hyp: Die Nord ##AT##-##AT## Achse ist lang .                      (7 tokens)
    assert split_compounds(tokenize(ref, "de")).split() == [
        "Die",
        "Nord",
        "##AT##-##AT##",
        "Süd",
        "##AT##-##AT##",
        "Achse",
        "ist",
        "lang",
        ".",
    ]
    # matches: 1-grams 7/7, 2-grams 6/6, 3-grams 4/5, 4-grams 2/4; brevity penalty exp(1 - 9/7)
    expected = 100 * math.exp(1 - 9 / 7) * (1 * 1 * 4 / 5 * 2 / 4) ** 0.25
    assert expected == pytest.approx(59.7628, abs=1e-4)
    score = metrics.bleu_tok([hyp], [ref], "de")
    assert score.counts == [7, 6, 4, 2] and score.totals == [7, 6, 5, 4]
    assert score.score == pytest.approx(expected, abs=1e-6)
    # without compound splitting "Nord-Achse" would be one unmatched token: a lower score
    plain = sacrebleu.corpus_bleu(
        [tokenize(hyp, "de")], [[tokenize(ref, "de")]], tokenize="none", smooth_method="none"
    )
    assert plain.score < 40
    # the 13a-tokenised sacreBLEU keeps compounds whole too
    assert metrics.bleu([hyp], [ref]).score == pytest.approx(
        sacrebleu.corpus_bleu([hyp], [[ref]]).score
    )


def test_compound_splitting_as_perl_does_it():
    assert split_compounds("rich-text format") == "rich ##AT##-##AT## text format"
    assert (
        split_compounds("state-of-the-art")
        == "state ##AT##-##AT## of ##AT##-##AT## the ##AT##-##AT## art"
    )
    assert split_compounds("a-b-c") == "a ##AT##-##AT## b-c"  # Perl's s///g: matches do not overlap
    assert split_compounds("- a - b -x") == "- a - b -x"


@pytest.mark.parametrize(
    "lang,text,tokens",
    [
        ("en", "Hello, world!", "Hello , world !"),
        ("en", "I don't know, Mr. Smith.", "I don 't know , Mr. Smith ."),
        ("en", "It costs 1,000 dollars in the U.S.", "It costs 1,000 dollars in the U.S."),
        ("en", "the 1990's", "the 1990 's"),
        ("en", "Wait... what?", "Wait ... what ?"),
        ("fr", "L'homme est là.", "L' homme est là ."),
        ("de", "Wie geht's?", "Wie geht ' s ?"),
        (
            "de",
            "Ein Mann im T-Shirt (rot) fährt ca. 5 km.",
            "Ein Mann im T-Shirt ( rot ) fährt ca. 5 km .",
        ),
        ("de", '"Ja", sagte sie.', '" Ja " , sagte sie .'),
    ],
)
def test_moses_style_tokens(lang, text, tokens):
    assert tokenize(text, lang) == tokens


def test_line_count_mismatch_is_an_error():
    task = _task()
    with pytest.raises(DataError, match="2 hypotheses for 3 references"):
        task.score(["a b c", "d e f"], ["a b c", "d e f", "g h i"])
    for metric in (metrics.bleu, metrics.bleu_tok, metrics.chrf):
        with pytest.raises(DataError, match="3 hypotheses for 2 references"):
            metric(["a", "b", "c"], ["a", "b"])
    with pytest.raises(DataError, match="no references"):
        task.score([], [])


def test_score_needs_no_vocabulary():
    score = _task().score(["Ein Mann fährt Rad."], ["Ein Mann fährt Rad."])
    assert score.value == 100.0 and score.figures["bleu_tok"] == 100.0 and score.name == "bleu"


def test_s2s_score_prints_both_bleu_figures(references, tmp_path, capsys):
    import json

    from s2s.core.apps.cli import main

    ref, hyp = tmp_path / "ref.de", tmp_path / "hyp.de"
    ref.write_text("\n".join(references) + "\n", encoding="utf-8")
    hyps = _edits(references)["one_swap"]
    hyp.write_text("\n".join(hyps) + "\n", encoding="utf-8")
    assert main(["score", "translation", "--ref", str(ref), "--hyp", str(hyp), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [references]).score, abs=0.01)
    assert out["bleu_tok"] == pytest.approx(
        metrics.bleu_tok(hyps, references, "de").score, abs=0.01
    )
    assert "chrf" in out and out["signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")


def test_s2s_score_takes_overrides_for_french_rules(tmp_path, capsys):
    """`s2s score translation task.tgt_lang=fr` tokenises with the French Moses rules."""
    import json

    from s2s.core.apps.cli import main

    refs = ["Il s'agit d'un homme que l'on voit aujourd'hui.", "Une femme et l'enfant jouent."]
    hyps = ["Il s'agit d'un homme qu'on voit aujourd'hui.", "Une femme et l'enfant jouent."]
    ref, hyp = tmp_path / "ref.fr", tmp_path / "hyp.fr"
    ref.write_text("\n".join(refs) + "\n", encoding="utf-8")
    hyp.write_text("\n".join(hyps) + "\n", encoding="utf-8")
    figures = {}
    for lang in ("de", "fr"):
        assert (
            main(
                [
                    "score",
                    "translation",
                    f"task.tgt_lang={lang}",
                    "--ref",
                    str(ref),
                    "--hyp",
                    str(hyp),
                    "--json",
                ]
            )
            == 0
        )
        figures[lang] = json.loads(capsys.readouterr().out)["bleu_tok"]
        assert figures[lang] == pytest.approx(metrics.bleu_tok(hyps, refs, lang).score, abs=0.01)
    assert figures["fr"] != figures["de"]  # "qu'on": French rules keep the apostrophe on "qu'"
    assert (
        main(["score", "translation", "task.tgt_lagn=fr", "--ref", str(ref), "--hyp", str(hyp)])
        == 2
    )
    assert "task.tgt_lang" in capsys.readouterr().err
