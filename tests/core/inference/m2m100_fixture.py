"""An NLLB-shaped and an M2M100-shaped model for the import's and the export's tests and for
bench/interop/ (nllb_import.py, nllb_finetune.py, nllb_600m.py, ct2_imports.py), and what each
toolkit makes of it: kept with the tests, which import nothing from bench/.

`build_m2m100(folder, lines, layout)` saves what facebook/nllb-200-* (`layout="nllb"`) or
facebook/m2m100_* (`layout="m2m100"`) hold on the hub, at small sizes: transformers'
M2M100ForConditionalGeneration (pre-norm with final layer norms, scaled embeddings, sinusoids
offset past the padding index, ReLU, every embedding tied) with random weights, and the
tokenizer's files: a sentencepiece BPE model trained on the given lines; NLLB's
sentencepiece.bpe.model with its 202 language codes after the pieces, or M2M100's vocab.json
beside it with its 100 codes. Its weights are drawn wider than transformers' init (std
`init_std` against 0.02) so that the model's choices are not near-ties that float rounding
decides; random weights alone decode one token over and over, so with `pairs` the model is
trained a few hundred updates (the benchmarks': Multi30k's pairs in both directions, outputs of
sentence length), or without them </s> is favoured (`eos_scale`, the tests': outputs that end).
`hf_ids` / `s2s_ids` and `hf_generate` / `s2s_generate` give each toolkit's ids and outputs of
the same lines in a direction.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]  # the checkout whose s2s `s2s_generate` runs


def build_m2m100(
    folder: Path,
    lines: list[str],
    layout: str = "nllb",
    vocab_size: int = 1000,
    d_model: int = 64,
    encoder_layers: int = 2,
    decoder_layers: int = 2,
    seed: int = 1,
    init_std: float = 0.1,
    pairs: dict | None = None,
    updates: int = 300,
    max_length: int = 64,
    eos_scale: float | None = None,
) -> Path:
    """Save an NLLB-shaped (`layout="nllb"`) or M2M100-shaped (`"m2m100"`) model and its
    tokenizer into `folder`, the sentencepiece BPE model trained on `lines`. With `pairs`
    ({(src, tgt): (sources, targets)} in the layout's codes) the model, drawn at random, is
    trained `updates` steps on them: random weights alone decode the same token over and over
    to max_length (or stop at once), a few hundred updates give outputs of sentence length that
    depend on the source. `eos_scale` scales </s>'s row (random weights: outputs that end
    sooner, for tests that decode an untrained model; None: not scaled)."""
    import sentencepiece
    import torch
    from transformers import GenerationConfig, M2M100Config, M2M100ForConditionalGeneration

    folder.mkdir(parents=True, exist_ok=True)
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_prefix=str(folder / "spm"),
        vocab_size=vocab_size,
        model_type="bpe",
        character_coverage=1.0,
        minloglevel=2,
        num_threads=1,
    )
    (folder / "spm.model").rename(folder / "sentencepiece.bpe.model")
    (folder / "spm.vocab").unlink()
    spm = sentencepiece.SentencePieceProcessor(model_file=str(folder / "sentencepiece.bpe.model"))
    if layout == "nllb":
        from transformers import NllbTokenizer
        from transformers.models.nllb.tokenization_nllb import FAIRSEQ_LANGUAGE_CODES

        # converted from the sentencepiece model (protobuf), the 202 codes after the pieces
        tok = NllbTokenizer.from_pretrained(
            str(folder), src_lang="eng_Latn", additional_special_tokens=FAIRSEQ_LANGUAGE_CODES
        )
        rows = len(tok)
    else:
        from transformers import M2M100Tokenizer

        # fairseq's dictionary: <s> <pad> </s> <unk>, then the pieces (the spm's own specials
        # left out), numbered in order
        words = ["<s>", "<pad>", "</s>", "<unk>"] + [
            spm.id_to_piece(i) for i in range(spm.get_piece_size()) if not spm.is_control(i)
        ][1:]
        vocab = {w: i for i, w in enumerate(words)}
        (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), "utf-8")
        tok = M2M100Tokenizer(
            str(folder / "vocab.json"), str(folder / "sentencepiece.bpe.model"), src_lang="en"
        )
        rows = len(vocab) + len(tok.lang_code_to_id) + tok.num_madeup_words
    tok.save_pretrained(str(folder))
    config = M2M100Config(
        vocab_size=rows,
        d_model=d_model,
        encoder_layers=encoder_layers,
        decoder_layers=decoder_layers,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=4 * d_model,
        decoder_ffn_dim=4 * d_model,
        max_position_embeddings=256,
        scale_embedding=True,
        init_std=init_std,
        dropout=0.1,
        attention_dropout=0.1,
        activation_dropout=0.0,
        encoder_layerdrop=0.05,
        decoder_layerdrop=0.05,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=2,
    )
    torch.manual_seed(seed)
    hf = M2M100ForConditionalGeneration(config)
    if eos_scale is not None:
        with torch.no_grad():
            hf.model.shared.weight[2] *= eos_scale
    if pairs:
        _train(hf, tok, pairs, updates, seed)
    hf.eval()
    hf.generation_config = GenerationConfig(
        decoder_start_token_id=2,
        bos_token_id=0,
        eos_token_id=2,
        pad_token_id=1,
        num_beams=4,
        max_length=max_length,
        length_penalty=1.0,
    )
    hf.save_pretrained(str(folder))
    return folder


def _train(hf, tok, pairs: dict, updates: int, seed: int, batch: int = 32) -> None:
    """`updates` Adam steps (lr 1e-3, fp32) of `hf` on batches of `batch` pairs, each batch one
    direction of `pairs` in turn: the tokenizer's ids with the source's code and the target's
    (text_target), the loss transformers' (labels, padding masked)."""
    import random

    import torch

    rng = random.Random(seed)
    hf.train()
    optimizer = torch.optim.Adam(hf.parameters(), lr=1e-3)
    directions = list(pairs)
    for step in range(updates):
        src, tgt = directions[step % len(directions)]
        sources, targets = pairs[(src, tgt)]
        chosen = rng.sample(range(len(sources)), batch)
        tok.src_lang, tok.tgt_lang = src, tgt
        enc = tok(
            [sources[i] for i in chosen],
            text_target=[targets[i] for i in chosen],
            return_tensors="pt",
            padding=True,
        )
        enc["labels"][enc["labels"] == tok.pad_token_id] = -100
        loss = hf(**enc).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    hf.eval()


def _tokenizer(folder: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


def hf_ids(folder: Path, lines: list[str], src: str) -> list[list[int]]:
    """NllbTokenizer's / M2M100Tokenizer's ids of each line with `src` its language (the code,
    the pieces, </s>)."""
    tok = _tokenizer(folder)
    tok.src_lang = src
    return [tok(line)["input_ids"] for line in lines]


def hf_generate(
    folder: Path, lines: list[str], src: str, tgt: str, beam: int, batch: int = 64
) -> list[str]:
    """transformers' own outputs for `lines`: the tokenizer with src_lang, generate with the
    target's code forced (forced_bos_token_id), fp32, decoded without special tokens. Sources
    are decoded in batches of one token length, no padding at all: transformers' output for a
    line can change with the padding of the batch it is decoded in (s2s's does not), so a
    padded batch would compare the padding, not the models."""
    import torch
    from transformers import M2M100ForConditionalGeneration

    tok = _tokenizer(folder)
    tok.src_lang = src
    model = M2M100ForConditionalGeneration.from_pretrained(str(folder)).eval()
    code = tok.convert_tokens_to_ids(tok.lang_code_to_token[tgt] if "_" not in tgt else tgt)
    ids = [tok(line)["input_ids"] for line in lines]
    by_length: dict[int, list[int]] = {}
    for i, line_ids in enumerate(ids):
        by_length.setdefault(len(line_ids), []).append(i)
    out = [""] * len(lines)
    with torch.inference_mode():
        for same in by_length.values():
            for k in range(0, len(same), batch):
                chosen = same[k : k + batch]
                source = torch.tensor([ids[i] for i in chosen])
                found = model.generate(
                    input_ids=source,
                    attention_mask=torch.ones_like(source),
                    num_beams=beam,
                    do_sample=False,
                    forced_bos_token_id=code,
                )
                texts = tok.batch_decode(
                    found, skip_special_tokens=True, clean_up_tokenization_spaces=False
                )
                for i, text in zip(chosen, texts):
                    out[i] = text.strip()
    return out


def s2s_ids(run_dir: Path, lines: list[str], src: str) -> list[list[int]]:
    """The imported run's ids of each line with `src` its language, in the source model's
    numbering, with </s>."""
    from s2s.core.tokenizers import EOS
    from s2s.core.tokenizers.pieces import Pieces

    vocab = Pieces.load(run_dir / "pieces.src.json")
    vocab.choose(src, "src")
    return [[vocab.source_ids[i] for i in ids + [EOS]] for ids in vocab.encode(lines)]


def s2s_generate(run_dir: Path, input_file: Path, src: str, tgt: str, beam: int) -> list[str]:
    """`s2s generate RUN --input FILE --src-lang SRC --tgt-lang TGT decode.beam=B
    decode.precision=fp32`, from the shell."""
    done = subprocess.run(
        [sys.executable, "-m", "s2s.core.apps.cli", "generate", str(run_dir), "--input",
         str(input_file), "--src-lang", src, "--tgt-lang", tgt, f"decode.beam={beam}",
         "decode.precision=fp32", "run.device=cpu", "run.threads=1"],
        capture_output=True, text=True, check=True, cwd=REPO,
    )  # fmt: skip
    return done.stdout.splitlines()
