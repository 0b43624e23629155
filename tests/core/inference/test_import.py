"""`s2s import`: an OPUS-MT-shaped model (transformers' MarianMTModel, sentencepiece models on
Multi30k) decodes in s2s exactly as transformers' `generate` decodes it, its ids are
MarianTokenizer's, and what the importer cannot read is refused in one line."""

import importlib.util
import json
import shutil

import pytest
import torch
from cli_checks import fails, s2s, snapshot
from conftest import MULTI30K, corpus

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None
    or importlib.util.find_spec("sentencepiece") is None,
    reason="transformers is not installed (pip install -e '.[export]')",
)

LINES = 60  # test sources compared (python -m bench.interop.opus_mt compares all 1,000)


@pytest.fixture(scope="module")
def opus_mt(tmp_path_factory):
    """(folder, run directory, test lines): a small OPUS-MT-shaped model and its import."""
    from opus_mt_fixture import build_opus_mt

    root = corpus(MULTI30K)
    src = (root / "train.en").read_text(encoding="utf-8").splitlines()[:4000]
    tgt = (root / "train.de").read_text(encoding="utf-8").splitlines()[:4000]
    test = (root / "test_2016_flickr.en").read_text(encoding="utf-8").splitlines()[:LINES]
    tmp = tmp_path_factory.mktemp("opus")
    folder = build_opus_mt(tmp / "opus-mt-en-de", src, tgt, vocab_size=400, d_model=32)
    run = tmp / "run"
    from s2s.core.apps.cli import main

    assert main(["import", str(folder), "--output", str(run)]) == 0
    return folder, run, test


def test_ids_are_marian_tokenizers(opus_mt):
    from opus_mt_fixture import marian_ids, s2s_ids

    folder, run, test = opus_mt
    extra = ["", ">>deu<< A dog runs.", "Ünïcödé — «quotes» and    spaces"]
    lines = test + extra
    assert s2s_ids(run, lines) == marian_ids(folder, lines)
    # the one difference, on purpose: a special's name in text is text to s2s (MarianTokenizer
    # reads "</s>" there as the end of the sentence)
    special = "a </s> b"
    [ours], [theirs] = s2s_ids(run, [special]), marian_ids(folder, [special])
    assert ours.count(0) == 1 and theirs.count(0) == 2  # 0: OPUS-MT's </s>


@pytest.mark.parametrize("beam", [1, 4])
def test_generate_equals_transformers(opus_mt, beam, tmp_path):
    from opus_mt_fixture import hf_generate, s2s_generate

    folder, run, test = opus_mt
    source = tmp_path / "test.en"
    source.write_text("\n".join(test) + "\n", encoding="utf-8")
    assert s2s_generate(run, source, beam) == hf_generate(folder, test, beam)


def test_the_run_records_its_origin(opus_mt):
    from omegaconf import OmegaConf

    folder, run, _ = opus_mt
    cfg = OmegaConf.load(run / "config.yaml")
    assert cfg.origin.format == "marian" and cfg.origin.source == str(folder)
    assert set(cfg.origin.files) >= {"config.json", "model.safetensors", "vocab.json"}
    assert cfg.model.activation == "swish" and cfg.model.output_bias
    assert cfg.decode.length_penalty == "power" and cfg.decode.stop == "transformers"


def test_score_targets_and_nbest_use_the_import(opus_mt, tmp_path, capsys):
    """Any decoding option works on an import: n-best lists, scores of given targets."""
    _, run, test = opus_mt
    source = tmp_path / "in.en"
    source.write_text("\n".join(test[:3]) + "\n", encoding="utf-8")
    code, out, err = s2s(capsys, "generate", run, "--input", source, "--nbest", "2", "--json")
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert len(rows) == 3 and all(len(r["outputs"]) == 2 for r in rows)


def refuse(capsys, folder, output, *needles):
    before = snapshot(folder, output.parent)
    fails(s2s(capsys, "import", folder, "--output", output), before, *needles)


def test_bad_sources_are_refused_in_one_line(opus_mt, tmp_path, capsys):
    folder, _, _ = opus_mt
    out = tmp_path / "out" / "run"
    out.parent.mkdir()

    def copy(name):
        where = tmp_path / name
        shutil.copytree(folder, where)
        return where

    t5 = copy("t5")
    cfg = json.loads((t5 / "config.json").read_text())
    (t5 / "config.json").write_text(json.dumps({**cfg, "model_type": "t5"}))
    refuse(capsys, t5, out, "config.json", "T5", "marian")

    nllb = copy("nllb")
    (nllb / "config.json").write_text(json.dumps({**cfg, "model_type": "m2m_100"}))
    refuse(capsys, nllb, out, "NLLB")

    small = copy("small_vocab")
    (small / "config.json").write_text(json.dumps({**cfg, "vocab_size": cfg["vocab_size"] - 5}))
    refuse(capsys, small, out, "config.json", "vocab_size")

    no_spm = copy("no_spm")
    (no_spm / "target.spm").unlink()
    refuse(capsys, no_spm, out, "target.spm", "missing")

    cut = copy("truncated")
    weights = cut / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    refuse(capsys, cut, out, "model.safetensors", "unreadable")

    relu6 = copy("relu6")
    (relu6 / "config.json").write_text(json.dumps({**cfg, "activation_function": "relu6"}))
    refuse(capsys, relu6, out, "activation_function", "relu6")

    refuse(capsys, tmp_path / "nowhere" / "x" / "y", out, "neither a folder nor a hub name")
    out.mkdir()
    refuse(capsys, folder, out, str(out), "exists")


def test_import_weights_equal_the_source(opus_mt):
    """Every imported parameter is the source's, in s2s's order of ids and dimensions."""
    from safetensors.torch import load_file

    from s2s.core.tokenizers.pieces import Pieces
    from s2s.core.inference.formats.common import permutation
    from s2s.core.runs.checkpoint import listed, load

    folder, run, _ = opus_mt
    theirs = load_file(str(folder / "model.safetensors"))
    ours = load(listed(run)[0])["model"]
    vocab = Pieces.load(run / "pieces.tgt.json")
    perm = permutation(ours["tgt_embed.weight"].size(1))
    shared = theirs["model.shared.weight"]
    for i in range(1, len(vocab)):
        assert torch.equal(ours["tgt_embed.weight"][i][perm], shared[vocab.source_ids[i]])
    assert torch.isneginf(ours["out.bias"][0])
    q = theirs["model.decoder.layers.1.encoder_attn.q_proj.weight"]
    assert torch.equal(ours["decoder.1.cross_attn.w_q.weight"][:, perm], q)


@pytest.mark.slow
def test_fine_tuning_an_import(opus_mt, tmp_path, capsys):
    """`s2s train finetune_translation run.init_from=IMPORT` trains on with the import's
    vocabulary and shape (every row carried), lowers the dev loss, and tests at the end; a
    model setting that contradicts the weights is refused in one line."""
    _, run, _ = opus_mt
    root, data = corpus(MULTI30K), tmp_path / "data"
    data.mkdir()
    for split, name, n in (("train", "train", 1000), ("valid", "val", 60), ("test", "val", 60)):
        for lang in ("en", "de"):
            lines = (root / f"{name}.{lang}").read_text(encoding="utf-8").splitlines()[:n]
            (data / f"{split}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    common = [
        f"run.init_from={run}",
        f"task.data_dir={data}",
        f"data.cache_dir={tmp_path / 'cache'}",
        "decode.max_len_b=30",
        "run.threads=1",
    ]
    out = tmp_path / "ft"
    before = snapshot(tmp_path / "data")
    bad = [f"run.dir={tmp_path / 'bad'}", "model.layers=6"]
    fails(s2s(capsys, "train", "finetune_translation", *common, *bad), before, "model.layers")
    args = [f"run.dir={out}", "optim.lr_scale=1", "optim.warmup=10", "optim.max_updates=40"]
    args += ["run.valid_interval=20", "run.save_interval=20", "-q"]
    code, _, err = s2s(capsys, "train", "finetune_translation", *common, *args)
    assert code == 0, err
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if r.get("kind") == "valid"]
    assert len(losses) == 2 and losses[1] < losses[0]
    assert json.loads((out / "result.json").read_text())["test"]["sentences"] == 60
    assert (out / "pieces.src.json").read_bytes() == (run / "pieces.src.json").read_bytes()


def test_export_of_an_import_imports_back_bitwise(opus_mt, tmp_path, capsys):
    """`s2s export --to huggingface` gives an import back in its model's own numbering and
    MarianTokenizer's files; importing that again gives every parameter bit for bit, and
    transformers decodes the export as it decodes the original."""
    from opus_mt_fixture import hf_generate

    from s2s.core.runs.checkpoint import listed, load

    folder, run, test = opus_mt
    exported, again = tmp_path / "hf", tmp_path / "again"
    assert s2s(capsys, "export", run, "--to", "huggingface", "--output", exported)[0] == 0
    assert s2s(capsys, "import", exported, "--output", again)[0] == 0
    first, second = (load(listed(r)[0])["model"] for r in (run, again))
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)
    lines = test[:10]
    assert hf_generate(exported, lines, 4) == hf_generate(folder, lines, 4)


def test_a_hub_name_offline_is_one_line(tmp_path, capsys, monkeypatch):
    """A hub name goes through huggingface_hub's download and cache; offline and not cached,
    that is one line naming the model."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    out = tmp_path / "run"
    before = snapshot(tmp_path)
    fails(
        s2s(capsys, "import", "Helsinki-NLP/opus-mt-xx-yy", "--output", out),
        before,
        "Helsinki-NLP/opus-mt-xx-yy",
        "not found in the local cache",
    )


def test_separate_vocabularies_and_pytorch_weights(tmp_path, capsys):
    """An OPUS-MT model with a source and a target vocabulary (target_vocab.json, embeddings of
    their own) whose weights are a pytorch_model.bin: its import decodes as transformers does."""
    from opus_mt_fixture import build_opus_mt, hf_generate, marian_ids, s2s_generate, s2s_ids
    from safetensors.torch import load_file

    root = corpus(MULTI30K)
    src = (root / "train.en").read_text(encoding="utf-8").splitlines()[:3000]
    tgt = (root / "train.de").read_text(encoding="utf-8").splitlines()[:3000]
    test = (root / "test_2016_flickr.en").read_text(encoding="utf-8").splitlines()[:25]
    folder = build_opus_mt(tmp_path / "m", src, tgt, 300, 32, separate=True)
    weights = folder / "model.safetensors"
    torch.save(load_file(str(weights)), folder / "pytorch_model.bin")
    weights.unlink()
    run = tmp_path / "run"
    assert s2s(capsys, "import", folder, "--output", run)[0] == 0
    assert (run / "pieces.src.json").read_bytes() != (run / "pieces.tgt.json").read_bytes()
    assert s2s_ids(run, test) == marian_ids(folder, test)
    source = tmp_path / "in.en"
    source.write_text("\n".join(test) + "\n", encoding="utf-8")
    for beam in (1, 4):
        assert s2s_generate(run, source, beam) == hf_generate(folder, test, beam)


def test_hostile_model_files_are_refused_in_one_line(opus_mt, tmp_path, capsys):
    """Every tensor is checked against the shape its config gives (never cut to fit), its type
    and finiteness; every value read from config.json, generation_config.json,
    tokenizer_config.json and vocab.json is typed, named with its file and key; a local folder has
    no --revision; an s2s run directory is named as such (issue 77, round 6)."""
    from safetensors.torch import load_file, save_file

    folder, run, _ = opus_mt
    out = tmp_path / "out" / "run"
    out.parent.mkdir()
    weights = load_file(str(folder / "model.safetensors"))
    fc1 = "model.encoder.layers.0.fc1.weight"

    def variant(name, tensors=None, **files):
        where = tmp_path / name
        shutil.copytree(folder, where)
        if tensors is not None:
            save_file({**weights, **tensors}, str(where / "model.safetensors"))
        for file, change in files.items():
            path = where / f"{file}.json"
            path.write_text(json.dumps(change(json.loads(path.read_text()))))
        return where

    wide = torch.cat([weights[fc1], torch.ones(weights[fc1].size(0), 3)], dim=1)
    refuse(capsys, variant("wide", {fc1: wide}), out, fc1, "shape", "needs")
    nan = weights[fc1].clone()
    nan[0, 0] = float("nan")
    refuse(capsys, variant("nan", {fc1: nan}), out, fc1, "1 NaN or infinite")
    whole = {fc1: weights[fc1].to(torch.int64)}
    refuse(capsys, variant("int", whole), out, fc1, "int64 values")

    def with_(**values):
        return lambda cfg: {**cfg, **values}

    refuse(capsys, variant("str", config=with_(d_model="32")), out, "config.json", 'd_model="32"')
    refuse(capsys, variant("half", config=with_(encoder_layers=1.5)), out, "encoder_layers=1.5")
    gen = variant("gen", generation_config=with_(max_length=-5))
    refuse(capsys, gen, out, "generation_config.json", "max_length=-5")
    tok = variant("tok", tokenizer_config=with_(separate_vocabs="false"))
    refuse(capsys, tok, out, "tokenizer_config.json", 'separate_vocabs="false"')

    def ids(change):
        return lambda vocab: change(dict(vocab))

    as_string = variant("id_str", vocab=ids(lambda v: {**v, "<unk>": str(v["<unk>"])}))
    refuse(capsys, as_string, out, "vocab.json", "'<unk>' has id \"1\"")
    gap = variant("gap", vocab=ids(lambda v: {k: i + (i >= 5) for k, i in v.items()}))
    refuse(capsys, gap, out, "vocab.json", "no piece has id 5")
    twice = variant("twice", vocab=ids(lambda v: {**v, "<unk>": v["</s>"]}))
    refuse(capsys, twice, out, "vocab.json", "both have id 0")

    # one vocabulary (vocab.json alone) but an encoder's table and a decoder's of their own
    shared = weights["model.shared.weight"]
    apart = {k: v for k, v in weights.items() if k != "model.shared.weight"}
    apart["model.encoder.embed_tokens.weight"] = shared
    apart["model.decoder.embed_tokens.weight"] = shared.flip(0).contiguous()
    two = variant("two_tables")
    save_file(apart, str(two / "model.safetensors"))
    refuse(capsys, two, out, "embedding tables differ", "one vocabulary")

    revision = [folder, "--output", out, "--revision", "main"]
    fails(s2s(capsys, "import", *revision), snapshot(folder), "--revision main", "local folder")
    refuse(capsys, run, out, "s2s run directory", "s2s generate")


def test_help_names_both_sources(capsys):
    from s2s.core.apps.cli import main

    with pytest.raises(SystemExit):
        main(["import", "--help"])
    text = "".join(capsys.readouterr().out.split())  # argparse wraps lines at hyphens
    assert "fairseq" in text and "OPUS-MT" in text


def test_an_import_and_its_reverse_do_not_ensemble(opus_mt, tmp_path, capsys):
    """The same vocabulary read the other way (--src-lang de --tgt-lang en) is another model's
    direction: an ensemble of the two is refused naming the languages."""
    folder, run, test = opus_mt
    reverse = tmp_path / "reverse"
    args = ["--src-lang", "de", "--tgt-lang", "en"]
    assert s2s(capsys, "import", folder, "--output", reverse, *args)[0] == 0
    source = tmp_path / "in.en"
    source.write_text(test[0] + "\n", encoding="utf-8")
    code, _, err = s2s(capsys, "generate", run, "--ensemble", reverse, "--input", source)
    assert code != 0 and "task.src_lang is 'de'" in err and len(err.strip().splitlines()) == 1


def test_a_broken_model_writes_valid_json(opus_mt, tmp_path, capsys):
    """A score that is not a number (a model whose weights went NaN after its import) is null in
    a --json line, never a bare NaN, which is not JSON."""
    from s2s.core.runs.checkpoint import atomic_save, listed, load

    _, run, test = opus_mt
    broken = tmp_path / "broken"
    shutil.copytree(run, broken)
    [path] = listed(broken)
    state = load(path)
    state["model"]["decoder.0.ffn.0.weight"].fill_(float("nan"))
    atomic_save(state, path)
    source = tmp_path / "in.en"
    source.write_text(test[0] + "\n", encoding="utf-8")
    args = ["--input", source, "--json", "decode.max_len_b=5"]
    code, out, err = s2s(capsys, "generate", broken, *args)
    assert code == 0, err

    def refuse(constant):
        raise AssertionError(f"{constant} in a --json line: {out}")

    [row] = [json.loads(line, parse_constant=refuse) for line in out.splitlines()]
    assert row["outputs"][0]["score"] is None


def test_depths_of_their_own(tmp_path, capsys):
    """An OPUS-MT-shaped model with 3 encoder and 2 decoder layers imports with those depths and
    decodes as transformers does, greedy and beam 4."""
    from opus_mt_fixture import build_opus_mt, hf_generate, s2s_generate
    from omegaconf import OmegaConf

    from s2s.core.runs.checkpoint import listed, load

    root = corpus(MULTI30K)
    src = (root / "train.en").read_text(encoding="utf-8").splitlines()[:3000]
    tgt = (root / "train.de").read_text(encoding="utf-8").splitlines()[:3000]
    test = (root / "test_2016_flickr.en").read_text(encoding="utf-8").splitlines()[:25]
    folder = build_opus_mt(tmp_path / "m", src, tgt, 300, 32, layers=3, decoder_layers=2)
    run = tmp_path / "run"
    assert s2s(capsys, "import", folder, "--output", run)[0] == 0
    cfg = OmegaConf.load(run / "config.yaml")
    assert (cfg.model.encoder_layers, cfg.model.decoder_layers) == (3, 2)
    weights = load(listed(run)[0])["model"]
    assert "encoder.2.ffn.0.weight" in weights and "decoder.2.ffn.0.weight" not in weights
    source = tmp_path / "in.en"
    source.write_text("\n".join(test) + "\n", encoding="utf-8")
    for beam in (1, 4):
        assert s2s_generate(run, source, beam) == hf_generate(folder, test, beam)


@pytest.mark.parametrize("layout", ["zip", "legacy"])
def test_an_import_is_the_same_from_every_weights_file(opus_mt, layout, tmp_path, capsys):
    """The checkpoint an import writes tensor by tensor is the Transformer's state dict: its
    keys in its order, each tensor its own memory, the tied embedding and output projection one
    matrix stored once; and the same whichever file the weights come in: model.safetensors (read
    a tensor at a time), pytorch_model.bin in torch.save's zip format (mapped) or in the legacy
    format (read whole)."""
    from omegaconf import OmegaConf
    from safetensors.torch import load_file

    from s2s.core.nn.model import Transformer
    from s2s.core.runs.checkpoint import listed, load

    folder, run, _ = opus_mt
    ours = load(listed(run)[0])["model"]
    cfg = OmegaConf.load(run / "config.yaml")
    rows = ours["src_embed.weight"].size(0)
    assert list(ours) == list(Transformer(cfg.model, rows, rows, True).state_dict())
    tied = {ours[k].untyped_storage().data_ptr() for k in ("src_embed.weight", "out.weight")}
    assert len(tied) == 1
    for name, tensor in ours.items():
        assert tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size(), name
    copy = tmp_path / "bin"
    shutil.copytree(folder, copy)
    weights = load_file(str(copy / "model.safetensors"))
    torch.save(weights, copy / "pytorch_model.bin", _use_new_zipfile_serialization=layout == "zip")
    (copy / "model.safetensors").unlink()
    again = tmp_path / "run"
    assert s2s(capsys, "import", copy, "--output", again)[0] == 0
    theirs = load(listed(again)[0])["model"]
    assert list(theirs) == list(ours)
    assert all(torch.equal(theirs[k], ours[k]) for k in ours)
