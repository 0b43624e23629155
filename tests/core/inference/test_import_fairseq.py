"""`s2s import` of a fairseq Transformer checkpoint: the layout fairseq's hub archives have
(model.pt, dict.SRC.txt, dict.TGT.txt, bpecodes), written here by hand with random weights
(fairseq itself is not installed for the tests; bench/fairseq_import.py decodes a real one with
both toolkits). The import decodes, its ids follow the dictionary, and what it cannot read is
refused in one line."""

import argparse
import io
import shutil

import pytest
import torch
from cli_checks import fails, s2s, snapshot

LINES = ["A man rides a bike .", "Two dogs play in the snow .", "A woman sings on a stage ."]


def fairseq_folder(tmp_path, arch="transformer", pre_norm=False, **extra):
    """A fairseq-shaped model folder: 2 + 2 layers, d 16, a joined dictionary."""
    from subword_nmt.apply_bpe import BPE
    from subword_nmt.learn_bpe import learn_bpe

    folder = tmp_path / "fairseq-model"
    folder.mkdir()
    codes = io.StringIO()
    learn_bpe(LINES * 3, codes, 20)
    (folder / "bpecodes").write_text(codes.getvalue(), encoding="utf-8")
    bpe = BPE(io.StringIO(codes.getvalue()), separator="@@")
    words = sorted({w for line in LINES for w in bpe.process_line(line).split()})
    dictionary = "".join(f"{w} {10}\n" for w in words)
    for lang in ("en", "de"):
        (folder / f"dict.{lang}.txt").write_text(dictionary, encoding="utf-8")
    V, d, ff = 4 + len(words), 16, 32
    g = torch.Generator().manual_seed(0)
    w = {}

    def add(name, *shape):
        w[name] = torch.randn(*shape, generator=g) * 0.3

    add("encoder.embed_tokens.weight", V, d)
    w["decoder.embed_tokens.weight"] = w["encoder.embed_tokens.weight"]
    w["decoder.output_projection.weight"] = w["encoder.embed_tokens.weight"]
    for stack in ("encoder", "decoder"):
        w[f"{stack}.embed_positions._float_tensor"] = torch.zeros(1)
        for i in range(2):
            p = f"{stack}.layers.{i}"
            attns = ["self_attn"] + (["encoder_attn"] if stack == "decoder" else [])
            for a in attns:
                for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
                    add(f"{p}.{a}.{proj}.weight", d, d)
                    add(f"{p}.{a}.{proj}.bias", d)
                add(f"{p}.{a}_layer_norm.weight", d)
                add(f"{p}.{a}_layer_norm.bias", d)
            add(f"{p}.fc1.weight", ff, d)
            add(f"{p}.fc1.bias", ff)
            add(f"{p}.fc2.weight", d, ff)
            add(f"{p}.fc2.bias", d)
            add(f"{p}.final_layer_norm.weight", d)
            add(f"{p}.final_layer_norm.bias", d)
        if pre_norm:
            add(f"{stack}.layer_norm.weight", d)
            add(f"{stack}.layer_norm.bias", d)
    model = {
        "activation_fn": "relu",
        **dict(
            arch=arch,
            encoder_embed_dim=d,
            decoder_embed_dim=d,
            encoder_ffn_embed_dim=ff,
            decoder_ffn_embed_dim=ff,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_normalize_before=pre_norm,
            decoder_normalize_before=pre_norm,
            share_all_embeddings=True,
            share_decoder_input_output_embed=True,
            dropout=0.1,
            max_source_positions=64,
            max_target_positions=64,
        ),
        **extra,
    }
    state = {
        "cfg": {
            "model": argparse.Namespace(**model),
            "task": {"_name": "translation", "source_lang": "en", "target_lang": "de"},
        },
        "model": w,
    }
    torch.save(state, folder / "model.pt")
    return folder


@pytest.mark.parametrize("pre_norm", [False, True])
def test_import_decodes(tmp_path, capsys, pre_norm):
    folder = fairseq_folder(tmp_path, pre_norm=pre_norm)
    run = tmp_path / "run"
    code, out, err = s2s(capsys, "import", folder, "--output", run)
    assert code == 0, err
    source = tmp_path / "in.en"
    source.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    code, out, err = s2s(capsys, "generate", run, "--input", source, "decode.max_len_b=10")
    assert code == 0, err
    assert len(out.splitlines()) == len(LINES)


def test_ids_follow_the_dictionary(tmp_path, capsys):
    """Moses tokens, BPE pieces, then the dictionary's numbers (s2s's ids map back to them)."""
    from s2s.core.tokenizers.moses_bpe import MosesBPE

    folder = fairseq_folder(tmp_path)
    assert s2s(capsys, "import", folder, "--output", tmp_path / "run")[0] == 0
    vocab = MosesBPE.load(tmp_path / "run" / "moses_bpe.src.json")
    words = ["<s>", "<pad>", "</s>", "<unk>"]
    words += [line.split()[0] for line in (folder / "dict.en.txt").read_text().splitlines()]
    [ids] = vocab.encode(["A man rides a bike."])
    pieces = [words[vocab.source_ids[i]] for i in ids]
    assert pieces[-1] == "." and pieces[-2] != "bike."  # Moses split the full stop off
    assert "<unk>" not in pieces and "".join(pieces).replace("@@", "") == "Amanridesabike."
    assert vocab.decode(ids) == "A man rides a bike."


def test_bad_checkpoints_are_refused_in_one_line(tmp_path, capsys):
    out = tmp_path / "out" / "run"
    out.parent.mkdir()

    def refuse(folder, *needles):
        before = snapshot(folder, out.parent)
        fails(s2s(capsys, "import", folder, "--output", out), before, *needles)

    def variant(name, **extra):
        where = tmp_path / name
        where.mkdir()
        return fairseq_folder(where, **extra)

    refuse(variant("lstm", arch="lstm"), "model.pt", "arch 'lstm'")
    refuse(variant("gelu", activation_fn="gelu"), "activation_fn='gelu'")
    refuse(variant("learned", encoder_learned_pos=True), "encoder_learned_pos")
    short = variant("short")
    lines = (short / "dict.en.txt").read_text().splitlines()
    for lang in ("en", "de"):
        (short / f"dict.{lang}.txt").write_text("\n".join(lines[:-2]) + "\n")
    refuse(short, "model.pt", "rows")
    no_codes = variant("no_codes")
    (no_codes / "bpecodes").unlink()
    refuse(no_codes, "BPE codes")
    bad_dict = variant("bad_dict")
    (bad_dict / "dict.de.txt").write_text("oops\n")
    refuse(bad_dict, "dict.de.txt, line 1")
    cut = variant("cut")
    data = (cut / "model.pt").read_bytes()
    (cut / "model.pt").write_bytes(data[: len(data) // 2])
    refuse(cut, "model.pt", "unreadable")
    shutil.rmtree(cut)


def test_hostile_checkpoints_are_refused_in_one_line(tmp_path, capsys):
    """fairseq's args read typed, every tensor checked against the shape its args give, a
    malformed bpecodes line named (not subword-nmt's own exit), and s2s's own run directory or
    checkpoint named as such (issue 77, round 6)."""
    out = tmp_path / "out" / "run"
    out.parent.mkdir()

    def refuse(source, *needles):
        before = snapshot(source if source.is_dir() else source.parent, out.parent)
        fails(s2s(capsys, "import", source, "--output", out), before, *needles)

    def variant(name, **extra):
        where = tmp_path / name
        where.mkdir()
        return fairseq_folder(where, **extra)

    refuse(variant("layers", encoder_layers="2"), "model.pt: args", 'encoder_layers="2"')
    refuse(variant("dropout", dropout=float("nan")), "dropout=NaN", "finite")
    refuse(variant("positions", max_source_positions=-1), "max_source_positions=-1")
    wide = variant("wide")
    saved = torch.load(wide / "model.pt", weights_only=False)
    name = "decoder.layers.1.fc2.weight"
    saved["model"][name] = torch.cat([saved["model"][name], torch.zeros(3, 32)])
    torch.save(saved, wide / "model.pt")
    refuse(wide, name, "shape [19, 32]", "needs [16, 32]")
    codes = variant("codes")
    lines = (codes / "bpecodes").read_text().splitlines()
    (codes / "bpecodes").write_text("\n".join(lines[:2] + ["a b c"] + lines[2:]) + "\n")
    refuse(codes, "bpecodes, line 3", "'a b c'", "not subword-nmt BPE codes")

    ok = variant("ok")
    run = tmp_path / "imported"
    assert s2s(capsys, "import", ok, "--output", run)[0] == 0
    refuse(run, "s2s run directory")
    [checkpoint] = (run / "checkpoints").glob("checkpoint_*.pt")
    refuse(checkpoint, "a checkpoint of s2s, not of fairseq")
