"""`s2s generate` beyond the single best, through the real command line and the Python API:
n-best lists, sampling, ensembles, forced prefixes, the model's score of given outputs; and
each bad option as one line before any decoding, with nothing written."""

import json

import pytest
from s2s.core.decode.sampling import Sampling
from s2s.core.decode.steps import length_penalty
from s2s.core.decode.terminology import holds_term
from s2s.core.errors import UsageError

from cli_checks import fails, s2s, snapshot

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def lines(demo_runs, tmp_path_factory):
    """Eight test sources of the demo task, as a file."""
    where = tmp_path_factory.mktemp("inputs")
    sources = next((demo_runs["a"].parent / "cache").glob("*/test.src.txt"))
    path = where / "in.txt"
    path.write_text("".join(sources.read_text().splitlines(True)[:8]))
    return path


def generate(capsys, run, lines, *options) -> list[str]:
    code, out, err = s2s(capsys, "generate", run, "--input", lines, "-q", *options)
    assert code == 0, err
    return out.splitlines()


def test_the_first_of_an_n_best_list_is_the_plain_output(demo_runs, lines, capsys):
    plain = generate(capsys, demo_runs["a"], lines)
    answers = [json.loads(x) for x in generate(capsys, demo_runs["a"], lines, "--nbest", "4")]
    assert [a["line"] for a in answers] == list(range(1, 9))
    assert [a["outputs"][0]["output"] for a in answers] == plain
    for a in answers:
        outs = a["outputs"]
        assert len(outs) == 4 and len({o["output"] for o in outs}) == 4
        assert [o["score"] for o in outs] == sorted((o["score"] for o in outs), reverse=True)
        for o in outs:  # no constraint: the search's score is the model's, over lp(Y)
            lp = length_penalty(o["tokens"], 0.6)
            assert o["score"] == pytest.approx(o["logprob"] / lp, abs=2e-3)
    single = [json.loads(x) for x in generate(capsys, demo_runs["a"], lines, "--json")]
    assert [s["outputs"] for s in single] == [a["outputs"][:1] for a in answers]


def test_sampling_repeats_for_a_seed(demo_runs, lines, capsys):
    draw = lambda seed: generate(  # noqa: E731
        capsys, demo_runs["a"], lines, "--sampling", "--nbest", "3", "--seed", seed
    )
    first = draw(1)
    assert first == draw(1) and first != draw(2)
    samples = [[o["output"] for o in json.loads(x)["outputs"]] for x in first]
    assert all(len(s) == 3 for s in samples) and any(len(set(s)) > 1 for s in samples)
    greedy = generate(capsys, demo_runs["a"], lines, "--beam", "1")
    assert generate(capsys, demo_runs["a"], lines, "--sampling", "--top-k", "1") == greedy


def test_mbr_writes_the_candidate_the_others_agree_with(demo_runs, lines, capsys):
    """--mbr chrf over 6 samples: each line is the candidate of the highest expected chrF
    against the 6 (as the JSON's utilities say), the same candidates --json lists."""
    from s2s.core.decode.mbr import expected_utilities

    options = ["--sampling", "--nbest", "6", "--seed", "3", "--epsilon", "0.02", "--mbr", "chrf"]
    chosen = generate(capsys, demo_runs["a"], lines, *options)
    answers = [json.loads(x) for x in generate(capsys, demo_runs["a"], lines, *options, "--json")]
    assert len(chosen) == len(answers) == 8
    for line, answer in zip(chosen, answers):
        outs = answer["outputs"]
        utilities = expected_utilities([o["output"] for o in outs], "chrf")
        assert [o["utility"] for o in outs] == [round(u, 4) for u in utilities]
        assert utilities == sorted(utilities, reverse=True) and line == outs[0]["output"]
    plain = generate(capsys, demo_runs["a"], lines, "--nbest", "4", "--mbr", "bleu")
    assert len(plain) == 8
    options[-1:] = ["bleu", "--mbr-method", "aggregate", "--json"]
    for answer in [json.loads(x) for x in generate(capsys, demo_runs["a"], lines, *options)]:
        outs = answer["outputs"]
        utilities = expected_utilities([o["output"] for o in outs], "bleu", "aggregate")
        assert [o["utility"] for o in outs] == [round(u, 4) for u in utilities]


def test_the_line_count_of_a_warning_counts_every_line_with_terms(
    demo_runs, lines, capsys, caplog, tmp_path
):
    """An undecodable last line with terms: the warning counts it among all 9 lines."""
    source = tmp_path / "in.txt"
    source.write_bytes(lines.read_bytes() + b"bad \xff line\n")
    (tmp_path / "terms.tsv").write_text("book\tkat\n")
    with caplog.at_level("WARNING", logger="s2s"):
        code, out, err = s2s(
            capsys, "generate", demo_runs["a"], "--input", source, "--terms", tmp_path / "terms.tsv"
        )
    assert code == 0 and len(out.splitlines()) == 9, err
    assert "1 of 9 line(s) could not be decoded" in caplog.text, caplog.text


def test_mbr_over_the_tasks_own_metric_ranks_in_its_direction(demo_runs, lines, capsys):
    """--mbr task: the demo's BLEU (better higher) of each candidate against each other one,
    averaged; the highest expected figure first, and written."""
    from omegaconf import OmegaConf
    from s2s.core.decode.mbr import expected_figures
    from s2s.plugins.demo import DemoConfig, DemoTask

    task = DemoTask(OmegaConf.structured(DemoConfig))
    options = ["--sampling", "--nbest", "4", "--seed", "3", "--mbr", "task"]
    chosen = generate(capsys, demo_runs["a"], lines, *options)
    answers = [json.loads(x) for x in generate(capsys, demo_runs["a"], lines, *options, "--json")]
    for line, answer in zip(chosen, answers):
        outs = answer["outputs"]
        figures, higher = expected_figures([o["output"] for o in outs], task.score)
        assert higher and [o["utility"] for o in outs] == [round(f, 4) for f in figures]
        assert figures == sorted(figures, reverse=True) and line == outs[0]["output"]


def test_ensembles(demo_runs, lines, capsys):
    a, b = demo_runs["a"], demo_runs["b"]
    alone = generate(capsys, a, lines)
    assert generate(capsys, a, lines, "--ensemble", a) == alone  # a model with itself
    with_untrained = generate(capsys, a, lines, "--ensemble", demo_runs["untrained"])
    assert with_untrained != alone
    assert with_untrained != generate(capsys, demo_runs["untrained"], lines)
    three = generate(capsys, a, lines, "--ensemble", b, demo_runs["narrow"])  # another shape
    assert len(three) == 8 and all(three)


def test_a_forced_prefix_is_kept_verbatim(demo_runs, lines, capsys, tmp_path):
    plain = generate(capsys, demo_runs["a"], lines)
    prefixes = ["de kat", "", "jeder berg jeder", "", "", "", "", "de"]
    (tmp_path / "prefixes.txt").write_text("".join(p + "\n" for p in prefixes))
    forced = generate(capsys, demo_runs["a"], lines, "--prefixes", tmp_path / "prefixes.txt")
    for prefix, out, before in zip(prefixes, forced, plain):
        assert out.startswith(prefix)
        if not prefix:
            assert out == before


def test_every_term_of_a_term_file_appears(demo_runs, lines, capsys, tmp_path):
    """Terms the model would not write where their source words are ("kat" for "book"): every
    output of a line with a source term holds its target term as a word; other lines are as
    they were."""
    terms = tmp_path / "terms.tsv"
    terms.write_text("book\tkat\nevery car\tmann berg\n")
    text = lines.read_text().splitlines()
    plain = generate(capsys, demo_runs["a"], lines)
    answers = generate(capsys, demo_runs["a"], lines, "--terms", terms, "--nbest", "3")
    outputs = [[o["output"] for o in json.loads(a)["outputs"]] for a in answers]
    with_terms = 0
    for source, outs, before in zip(text, outputs, plain):
        pairs = [("book", "kat"), ("every car", "mann berg")]
        wanted = [t for s, t in pairs if holds_term(source, s)]
        with_terms += bool(wanted)
        for out in outs:
            assert all(f" {t} " in f" {out} " for t in wanted), (source, out)
        if not wanted:
            assert outs[0] == before
    assert with_terms >= 2


def test_each_line_holds_its_own_terms(demo_runs, lines, capsys, tmp_path):
    """--line-terms: the terms of each line (TAB-separated targets, fairseq's --constraints
    layout), whatever its source holds; a line without terms is as it was."""
    per_line = ["kat", "", "mann berg\tkat", "", "", "", "", "berg"]
    (tmp_path / "line_terms.tsv").write_text("".join(t + "\n" for t in per_line))
    plain = generate(capsys, demo_runs["a"], lines)
    termed = generate(capsys, demo_runs["a"], lines, "--line-terms", tmp_path / "line_terms.tsv")
    for terms, out, before in zip(per_line, termed, plain):
        wanted = [t for t in terms.split("\t") if t]
        assert all(f" {t} " in f" {out} " for t in wanted), (terms, out)
        if not wanted:
            assert out == before


def test_the_model_scores_given_outputs(demo_runs, lines, capsys, tmp_path):
    answers = [json.loads(x) for x in generate(capsys, demo_runs["a"], lines, "--nbest", "2")]
    targets = tmp_path / "targets.txt"
    targets.write_text("".join(a["outputs"][1]["output"] + "\n" for a in answers))
    rated = [
        json.loads(x) for x in generate(capsys, demo_runs["a"], lines, "--score-targets", targets)
    ]
    for a, r in zip(answers, rated):
        assert r["logprob"] == pytest.approx(a["outputs"][1]["logprob"], abs=2e-3)
        assert r["tokens"] == len(r["token_logprobs"]) == a["outputs"][1]["tokens"]
        assert sum(r["token_logprobs"]) == pytest.approx(r["logprob"], abs=2e-3)


def test_the_python_api_decodes_as_generate_does(demo_runs, lines, capsys):
    from s2s.core.inference import load_run

    text = lines.read_text().splitlines()
    run = load_run(demo_runs["a"])
    plain = generate(capsys, demo_runs["a"], lines)
    assert [outs[0].text for outs in run.outputs(text, n=3)] == plain
    assert load_run([demo_runs["a"], demo_runs["a"]]).generate(text) == plain
    drawn = run.outputs(text, n=2, sampling=Sampling(seed=4))
    assert drawn == run.outputs(text, n=2, sampling=Sampling(seed=4))
    with pytest.raises(UsageError, match="sampling with terms: terms are placed by beam search"):
        run.outputs(text, sampling=Sampling(seed=4), terms=[("book", "kat")])
    with pytest.raises(UsageError, match="mbr-method 'exact'"):
        run.outputs(text, n=2, mbr="chrf", mbr_method="exact")
    with_terms = [outs[0].text for outs in run.outputs(text, terms=[("book", "kat")])]
    (lines.parent / "terms.tsv").write_text("book\tkat\n")
    assert with_terms == generate(
        capsys, demo_runs["a"], lines, "--terms", lines.parent / "terms.tsv"
    )
    rated = run.score(text, plain)
    best = [json.loads(x)["outputs"][0] for x in generate(capsys, demo_runs["a"], lines, "--json")]
    assert [r.logprob for r in rated] == pytest.approx([b["logprob"] for b in best], abs=2e-3)


@pytest.mark.parametrize(
    "options, needles",
    [
        (["--nbest", "0"], ["--nbest 0", "1 or more"]),
        (["--nbest", "5"], ["--nbest 5", "above the beam (4)"]),
        (["--sampling", "--temperature", "0"], ["--temperature 0.0", "[0.001, 1000]"]),
        (["--sampling", "--top-p", "1.5"], ["--top-p 1.5"]),
        (["--sampling", "--top-k", "-1"], ["--top-k -1"]),
        (["--temperature", "0.5"], ["--temperature 0.5", "only with --sampling"]),
        (["--mbr", "chrf"], ["--mbr chrf", "--nbest 2 or more"]),
        (["--sampling", "--epsilon", "1.5"], ["--epsilon 1.5", "[0, 0.5]"]),
        (["--epsilon", "0.1"], ["--epsilon 0.1", "only with --sampling"]),
        (["--score-targets", "{in}", "--nbest", "2"], ["--score-targets", "--nbest"]),
        (["--prefixes", "{unk}"], ["unk.txt, line 2", "cannot spell", "zzzq"]),
        (["--prefixes", "{long}"], ["long.txt, line 1", "at most"]),
        (["--prefixes", "{short}"], ["short.txt has 1 line(s)"]),
        (["--score-targets", "{huge}"], ["huge.txt, line 1", "target tokens", "at most 1024"]),
        (["--ensemble", "{parser}"], ["cannot ensemble", "parser", "vocabulary has"]),
        (["--terms", "{badterms}"], ["badterms.tsv, line 2", "source term<TAB>target term"]),
        (["--terms", "{unkterms}"], ["unkterms.tsv, line 1", "target vocabulary cannot spell"]),
        (["--line-terms", "{short}"], ["short.txt has 1 line(s)"]),
        (["--line-terms", "{unk}"], ["unk.txt, line 2", "cannot spell", "zzzq"]),
        (["--line-terms", "{in}", "--score-targets", "{in}"], ["--score-targets", "--line-terms"]),
        (["--sampling", "--terms", "{terms}"], ["--sampling with --terms", "beam search only"]),
        (["--sampling", "--epsilon", "0.02", "--line-terms", "{in}"], ["--line-terms"]),
        (["--nbest", "2", "--mbr-method", "aggregate"], ["--mbr-method aggregate", "--mbr"]),
    ],
)
def test_bad_options_fail_in_one_line_writing_nothing(
    demo_runs, lines, capsys, tmp_path, options, needles
):
    (tmp_path / "unk.txt").write_text("de\nde zzzq\n" + "\n" * 6)
    (tmp_path / "long.txt").write_text("de " * 300 + "\n" + "\n" * 7)
    (tmp_path / "short.txt").write_text("de\n")
    (tmp_path / "huge.txt").write_text(("de " * 1100 + "\n") * 8)
    (tmp_path / "badterms.tsv").write_text("book\tkat\ncar mann\n")
    (tmp_path / "unkterms.tsv").write_text("book\tzzzq\n")
    out = tmp_path / "out.txt"
    out.write_text("kept\n")
    places = {"in": lines, "unk": tmp_path / "unk.txt", "long": tmp_path / "long.txt"}
    places |= {"short": tmp_path / "short.txt", "parser": demo_runs["parser"]}
    places |= {"huge": tmp_path / "huge.txt"}
    places |= {"badterms": tmp_path / "badterms.tsv", "unkterms": tmp_path / "unkterms.tsv"}
    (tmp_path / "terms.tsv").write_text("book\tkat\n")
    places["terms"] = tmp_path / "terms.tsv"
    options = [str(o).format(**places) for o in options]
    before = snapshot(out, demo_runs["a"])
    result = s2s(capsys, "generate", demo_runs["a"], "--input", lines, "--output", out, *options)
    fails(result, before, *needles)


def test_a_parser_takes_no_term_file(demo_runs, lines, capsys, tmp_path):
    terms = tmp_path / "terms.tsv"
    terms.write_text("book\tkat\n")
    before = snapshot(tmp_path)
    result = s2s(capsys, "generate", demo_runs["parser"], "--input", lines, "--terms", terms)
    fails(result, before, "--terms", "writes no target words")


def test_the_server_takes_the_same_options(demo_runs, lines, capsys, tmp_path):
    """POST /generate with "nbest", "sampling" and "prefixes" answers as `s2s generate` does;
    each bad value is a 400 naming the field, and the server goes on."""
    from test_serve import post, server

    text = lines.read_text().splitlines()
    answers = [json.loads(x) for x in generate(capsys, demo_runs["a"], lines, "--nbest", "3")]
    prefixes = tmp_path / "prefixes.txt"
    prefixes.write_text("de kat\n" + "\n" * 7)
    forced = generate(capsys, demo_runs["a"], lines, "--prefixes", prefixes)
    (tmp_path / "terms.tsv").write_text("book\tkat\n")
    termed = generate(capsys, demo_runs["a"], lines, "--terms", tmp_path / "terms.tsv")
    with server(demo_runs["a"], log=tmp_path / "serve.log") as url:
        status, got = post(f"{url}/generate", {"text": text, "nbest": 3})
        assert status == 200
        assert [[o["output"] for o in outs] for outs in got["nbest"]] == [
            [o["output"] for o in a["outputs"]] for a in answers
        ]
        assert got["hypotheses"] == [a["outputs"][0]["output"] for a in answers]
        body = {"text": text[:2], "nbest": 4, "sampling": {"seed": 3, "top_p": 0.9}}
        status, drawn = post(f"{url}/generate", body)
        assert status == 200 and [len(outs) for outs in drawn["nbest"]] == [4, 4]
        assert post(f"{url}/generate", body)[1]["nbest"] == drawn["nbest"]  # alone: repeats
        chosen = generate(capsys, demo_runs["a"], lines, "--nbest", "3", "--mbr", "chrf")
        status, got = post(f"{url}/generate", {"text": text, "nbest": 3, "mbr": "chrf"})
        assert status == 200 and got["hypotheses"] == chosen
        assert all("utility" in o for outs in got["nbest"] for o in outs)
        options = ["--nbest", "3", "--mbr", "chrf", "--mbr-method", "aggregate"]
        chosen = generate(capsys, demo_runs["a"], lines, *options)
        body = {"text": text, "nbest": 3, "mbr": "chrf", "mbr_method": "aggregate"}
        status, got = post(f"{url}/generate", body)
        assert status == 200 and got["hypotheses"] == chosen
        status, got = post(f"{url}/generate", {"text": text, "prefixes": ["de kat"] + [""] * 7})
        assert status == 200 and got["hypotheses"] == forced
        status, got = post(f"{url}/generate", {"text": text, "terms": [["book", "kat"]]})
        assert status == 200 and got["hypotheses"] == termed
        for bad, field in [
            ({"nbest": 5}, '"nbest" 5'),
            ({"nbest": 0}, '"nbest" is the JSON number 0; at least 1'),
            ({"nbest": 17, "sampling": {}}, "at most 16 drawn"),
            ({"sampling": {"temperature": 0}}, "temperature 0"),
            ({"sampling": {"top_p": 2}}, "top-p 2"),
            ({"sampling": {"beam": 2}}, '"beam" is not a field of "sampling"'),
            ({"nbest": 3, "mbr": "ter"}, '"mbr" is the JSON string "ter"'),
            ({"mbr": "chrf"}, '"nbest" 2 or more'),
            ({"nbest": 2, "sampling": {"epsilon": 0.9}}, "epsilon 0.9"),
            ({"prefixes": ["de"]}, '"prefixes" holds 1 strings: send one a sentence'),
            ({"prefixes": ["de zzzq"] + [""] * 7}, '"prefixes"[0]: the target vocabulary'),
            ({"terms": [["book"]]}, '"terms"[0] holds 1 items; at least 2'),
            ({"terms": [["book", "zzzq"]]}, '"terms"[0]: the target vocabulary cannot spell'),
            ({"sampling": {}, "terms": [["book", "kat"]]}, '"sampling" with "terms": terms are'),
            ({"nbest": 3, "mbr_method": "aggregate"}, '"mbr_method" "aggregate": computes "mbr"'),
            ({"nbest": 3, "mbr": "chrf", "mbr_method": "all"}, '"mbr_method" is the JSON'),
        ]:
            status, got = post(f"{url}/generate", {"text": text, **bad})
            assert status == 400 and field in got["error"], (bad, got)
        assert post(f"{url}/generate", {"text": text[:1]})[0] == 200


def test_the_server_serves_ensembles_and_scores_given_outputs(demo_runs, lines, capsys, tmp_path):
    """`s2s serve --ensemble` answers what `s2s generate --ensemble` writes, its /attention shows
    the first model's weights; POST /score answers what `--score-targets` writes."""
    from test_serve import get, post, server

    text = lines.read_text().splitlines()
    a, b = demo_runs["a"], demo_runs["b"]
    both = generate(capsys, a, lines, "--ensemble", b)
    targets = tmp_path / "targets.txt"
    targets.write_text("".join(line + "\n" for line in both))
    rated = [json.loads(x) for x in generate(capsys, a, lines, "--score-targets", targets)]
    rated = [{k: v for k, v in r.items() if k != "line"} for r in rated]
    with server(a, "--ensemble", b, log=tmp_path / "serve.log") as url:
        assert get(f"{url}/info")[1]["ensemble"] == [str(b)]
        status, got = post(f"{url}/generate", {"text": text})
        assert status == 200 and got["hypotheses"] == both
        status, got = post(f"{url}/attention", {"text": text[0]})
        assert status == 200 and got["output"] == both[0] and got["heads"] == 2
    with server(a, log=tmp_path / "serve_a.log") as url:
        status, got = post(f"{url}/score", {"text": text, "targets": both})
        assert status == 200 and got["scores"] == rated
        for bad, needle in [
            ({"targets": both[:1]}, '"targets" holds 1 strings: send the output to score'),
            ({"targets": [1] * 8}, '"targets"[0] is the JSON number 1, not a string'),
            ({"targets": ["de\nde"] * 8}, '"targets"[0] holds a line break'),
            ({"targets": ["de " * 700] * 8}, "has 2100 characters; at most 2000"),
        ]:
            status, got = post(f"{url}/score", {"text": text, **bad})
            assert status in (400, 413) and needle in got["error"], (bad, got)
        assert post(f"{url}/score", {"text": text[:1], "targets": both[:1]})[0] == 200


def test_the_ctranslate2_export_gives_the_same_n_best(demo_runs, lines, capsys, tmp_path):
    """Where both search alike (no length penalty: CTranslate2's ranks by length^alpha, s2s's
    by ((5 + length) / 6)^alpha), the export's best output is s2s's on every line, and its
    whole 4-best list s2s's on most: the two keep different finished hypotheses beyond the
    first (CTranslate2 stops once the beam has that many, s2s once none can beat the n-th)."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    run = demo_runs["trained"]
    code, _, err = s2s(capsys, "export", run, "--to", "ctranslate2", "--output", tmp_path / "ct2")
    assert code == 0, err
    text = lines.read_text().splitlines()
    ours = [
        [o["output"] for o in json.loads(x)["outputs"]]
        for x in generate(capsys, run, lines, "--nbest", "4", "--alpha", "0")
    ]
    translator = ctranslate2.Translator(str(tmp_path / "ct2"))
    results = translator.translate_batch(
        [line.split() for line in text],
        beam_size=4,
        num_hypotheses=4,
        length_penalty=0.0,
        return_scores=True,
        max_input_length=0,
    )
    theirs = [[" ".join(h) for h in r.hypotheses] for r in results]
    assert [t[0] for t in theirs] == [o[0] for o in ours]
    assert sum(t == o for t, o in zip(theirs, ours)) >= len(text) // 2


def test_rerank_with_a_second_seed(demo_runs, lines, capsys, tmp_path):
    """`s2s rerank`: weights 0 keep the search's choice (generate's output); --tune-ref finds
    weights on dev that score at least the search's; a weight a scorer, else one line."""
    a, b = demo_runs["a"], demo_runs["b"]
    refs = next((a.parent / "cache").glob("*/test.ref.txt"))
    ref_file = tmp_path / "refs.txt"
    ref_file.write_text("".join(refs.read_text().splitlines(True)[:8]))
    base = ["rerank", a, "--input", lines, "--nbest", "4", "--with", b, "-q"]
    code, out, err = s2s(capsys, *base, "--weights", "0")
    assert code == 0, err
    assert out.splitlines() == generate(capsys, a, lines, "--beam", "4")
    code, out, err = s2s(capsys, *base, "--tune-ref", ref_file)
    assert code == 0, err
    tuned = json.loads(out)
    assert len(tuned["weights"]) == 1 and tuned["dev"] >= tuned["search"]
    code, out, err = s2s(capsys, *base, "--weights", ",".join(map(str, tuned["weights"])))
    assert code == 0 and len(out.splitlines()) == 8
    before = snapshot(tmp_path)
    fails(s2s(capsys, *base, "--weights", "1,2"), before, "--weights 1,2", "1 scorer")
    kept = snapshot(lines)
    fails(s2s(capsys, *base, "--weights", "0", "--output", lines), kept, "is --input")
