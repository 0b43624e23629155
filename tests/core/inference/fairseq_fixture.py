"""A fairseq-shaped Transformer checkpoint for the CTranslate2 export's tests and for
bench/interop/ct2_imports.py: kept with the tests, which import nothing from bench/.

`build_fairseq(folder, src_lines, tgt_lines)` saves what fairseq's hub archives of a
Transformer hold, at small sizes and with random weights (fairseq itself is not needed): a
model.pt of `--arch transformer --share-all-embeddings` (post-norm, ReLU, fairseq's sinusoids),
BPE merges learnt with subword-nmt on the Moses-tokenised lines (bpecodes), and one joined
dictionary as dict.en.txt and dict.de.txt. Its weights are drawn wider than fairseq's init
(std `init_std`) so that the model's choices are not near-ties that float rounding decides, and
</s>'s row is scaled (`eos_scale`) so that most outputs end before the length limit.
"""

from __future__ import annotations

import io
from pathlib import Path


def build_fairseq(
    folder: Path,
    src_lines: list[str],
    tgt_lines: list[str],
    merges: int = 2000,
    d_model: int = 64,
    layers: int = 2,
    seed: int = 1,
    init_std: float = 0.1,
    eos_scale: float = 3.0,
    max_positions: int = 256,
) -> Path:
    """Save a fairseq-shaped Transformer (`--arch transformer --share-all-embeddings`, post-norm,
    ReLU, fairseq's sinusoids) with random weights into `folder`: model.pt, bpecodes and one
    joined dictionary as dict.en.txt and dict.de.txt, the text Moses-tokenised as fairseq's
    `--tokenizer moses` does (dashes split, characters escaped). </s>'s embedding row (the
    output projection's too: tied) is scaled by `eos_scale` so that most outputs end."""
    import argparse as ap
    from collections import Counter

    import torch
    from sacremoses import MosesTokenizer
    from subword_nmt.apply_bpe import BPE
    from subword_nmt.learn_bpe import learn_bpe

    folder.mkdir(parents=True, exist_ok=True)
    tokenized = []
    for lang, lines in (("en", src_lines), ("de", tgt_lines)):
        moses = MosesTokenizer(lang)
        tokenized += [
            moses.tokenize(line, aggressive_dash_splits=True, return_str=True, escape=True)
            for line in lines
        ]
    codes = io.StringIO()
    learn_bpe(tokenized, codes, merges)
    (folder / "bpecodes").write_text(codes.getvalue(), encoding="utf-8")
    bpe = BPE(io.StringIO(codes.getvalue()), separator="@@")
    counts = Counter(w for line in tokenized for w in bpe.process_line(line).split())
    dictionary = "".join(f"{w} {n}\n" for w, n in counts.most_common())
    for lang in ("en", "de"):
        (folder / f"dict.{lang}.txt").write_text(dictionary, encoding="utf-8")
    V, d, ff = 4 + len(counts), d_model, 4 * d_model
    g = torch.Generator().manual_seed(seed)
    w = {}

    def add(name, *shape, std=init_std):
        w[name] = torch.randn(*shape, generator=g) * std

    add("encoder.embed_tokens.weight", V, d, std=d**-0.5)
    w["encoder.embed_tokens.weight"][1] = 0.0  # fairseq's <pad>
    w["encoder.embed_tokens.weight"][2] *= eos_scale
    w["decoder.embed_tokens.weight"] = w["encoder.embed_tokens.weight"]
    w["decoder.output_projection.weight"] = w["encoder.embed_tokens.weight"]
    for stack in ("encoder", "decoder"):
        w[f"{stack}.embed_positions._float_tensor"] = torch.zeros(1)
        for i in range(layers):
            p = f"{stack}.layers.{i}"
            for a in ["self_attn"] + (["encoder_attn"] if stack == "decoder" else []):
                for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
                    add(f"{p}.{a}.{proj}.weight", d, d)
                    add(f"{p}.{a}.{proj}.bias", d)
                w[f"{p}.{a}_layer_norm.weight"] = 1.0 + torch.randn(d, generator=g) * 0.1
                add(f"{p}.{a}_layer_norm.bias", d)
            add(f"{p}.fc1.weight", ff, d)
            add(f"{p}.fc1.bias", ff)
            add(f"{p}.fc2.weight", d, ff)
            add(f"{p}.fc2.bias", d)
            w[f"{p}.final_layer_norm.weight"] = 1.0 + torch.randn(d, generator=g) * 0.1
            add(f"{p}.final_layer_norm.bias", d)
    model = ap.Namespace(
        arch="transformer",
        activation_fn="relu",
        encoder_embed_dim=d,
        decoder_embed_dim=d,
        encoder_ffn_embed_dim=ff,
        decoder_ffn_embed_dim=ff,
        encoder_layers=layers,
        decoder_layers=layers,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_normalize_before=False,
        decoder_normalize_before=False,
        share_all_embeddings=True,
        share_decoder_input_output_embed=True,
        dropout=0.1,
        max_source_positions=max_positions,
        max_target_positions=max_positions,
    )
    state = {
        "cfg": {
            "model": model,
            "task": {"_name": "translation", "source_lang": "en", "target_lang": "de"},
        },
        "model": w,
    }
    torch.save(state, folder / "model.pt")
    return folder
