"""An OPUS-MT-shaped model for the import's tests and bench/opus_mt.py, and what each toolkit
makes of it.

`build_opus_mt(folder, ...)` saves what Helsinki-NLP's models hold on the hub, at small sizes:
transformers' MarianMTModel with OPUS-MT's configuration (swish, shared embeddings, a final
logits bias, "<pad>" as the decoder's start, bad_words_ids [[pad]], length_penalty 1.0) and
random weights, and MarianTokenizer's files: sentencepiece models trained on the given sides
(source.spm on the source, target.spm on the target) and one vocab.json over both. Its weights
are drawn wider than transformers' init (std `init_std` against 0.02) so that the model's
choices are not near-ties that float rounding decides, and its logits bias (random, N(0, 1))
favours </s> by `eos_bias`, so that most outputs end; those that reach the maximum length end
there as transformers ends them (decode.stop=transformers). `marian_ids` / `s2s_ids` and
`hf_generate` / `s2s_generate` give each toolkit's ids and outputs of the same lines.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]  # the checkout whose s2s `s2s_generate` runs


def build_opus_mt(
    folder: Path,
    src_lines: list[str],
    tgt_lines: list[str],
    vocab_size: int = 800,
    d_model: int = 64,
    layers: int = 2,
    seed: int = 1,
    init_std: float = 0.1,
    eos_bias: float = 5.5,
    separate: bool = False,
    decoder_layers: int | None = None,
) -> Path:
    """Save an OPUS-MT-shaped MarianMTModel and its tokenizer into `folder`; with `separate`,
    a source and a target vocabulary (vocab.json, target_vocab.json) and embeddings of their
    own, "<pad>" at the same id in both; `decoder_layers` (None: `layers`) for a decoder of
    another depth than the encoder's (OPUS-MT's distilled students)."""
    import sentencepiece
    import torch
    from transformers import GenerationConfig, MarianConfig, MarianMTModel

    folder.mkdir(parents=True, exist_ok=True)
    pieces = {}
    for name, lines in (("source", src_lines), ("target", tgt_lines)):
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=iter(lines),
            model_prefix=str(folder / name),
            vocab_size=vocab_size,
            model_type="unigram",
            character_coverage=1.0,
            minloglevel=2,
            num_threads=1,
        )
        (folder / f"{name}.model").rename(folder / f"{name}.spm")
        (folder / f"{name}.vocab").unlink()
        model = sentencepiece.SentencePieceProcessor(model_file=str(folder / f"{name}.spm"))
        pieces[name] = [
            model.id_to_piece(i) for i in range(model.get_piece_size()) if not model.is_control(i)
        ]

    def numbered(words):
        tokens = ["</s>", "<unk>"] + sorted(set(words) - {"<unk>", "</s>", "<s>"})
        return {t: i for i, t in enumerate(tokens[:2] + ["<pad>"] + tokens[2:] if separate
                                            else tokens + ["<pad>"])}  # fmt: skip

    vocab = numbered(pieces["source"] + ([] if separate else pieces["target"]))
    target = numbered(pieces["target"]) if separate else vocab
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    if separate:
        text = json.dumps(target, ensure_ascii=False)
        (folder / "target_vocab.json").write_text(text, encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"source_lang": "en", "target_lang": "de", "separate_vocabs": separate}),
        encoding="utf-8",
    )
    pad = vocab["<pad>"]
    assert target["<pad>"] == pad
    config = MarianConfig(
        vocab_size=len(vocab),
        decoder_vocab_size=len(target),
        d_model=d_model,
        encoder_layers=layers,
        decoder_layers=decoder_layers or layers,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=4 * d_model,
        decoder_ffn_dim=4 * d_model,
        activation_function="swish",
        max_position_embeddings=512,
        scale_embedding=True,
        share_encoder_decoder_embeddings=not separate,
        tie_word_embeddings=True,
        pad_token_id=pad,
        eos_token_id=0,
        decoder_start_token_id=pad,
        init_std=init_std,
        dropout=0.1,
    )
    torch.manual_seed(seed)
    hf = MarianMTModel(config).eval()
    with torch.no_grad():
        hf.final_logits_bias.normal_(0.0, 1.0)
        hf.final_logits_bias[0, 0] += eos_bias
    hf.generation_config = GenerationConfig(
        decoder_start_token_id=pad,
        eos_token_id=0,
        pad_token_id=pad,
        bad_words_ids=[[pad]],
        num_beams=4,
        max_length=512,
        length_penalty=1.0,
    )
    hf.save_pretrained(str(folder))
    return folder


def hf_generate(folder: Path, lines: list[str], beam: int, batch: int = 50) -> list[str]:
    """transformers' own outputs for `lines`: MarianTokenizer, MarianMTModel.generate (fp32)."""
    import torch
    from transformers import MarianMTModel, MarianTokenizer

    tok = MarianTokenizer.from_pretrained(str(folder))
    model = MarianMTModel.from_pretrained(str(folder)).eval()
    out = []
    with torch.inference_mode():
        for i in range(0, len(lines), batch):
            enc = tok(lines[i : i + batch], return_tensors="pt", padding=True)
            ids = model.generate(**enc, num_beams=beam, do_sample=False)
            out += tok.batch_decode(ids, skip_special_tokens=True)
    return out


def marian_ids(folder: Path, lines: list[str]) -> list[list[int]]:
    """MarianTokenizer's ids of each line (with its </s>)."""
    from transformers import MarianTokenizer

    tok = MarianTokenizer.from_pretrained(str(folder))
    return [tok(line)["input_ids"] for line in lines]


def s2s_ids(run_dir: Path, lines: list[str]) -> list[list[int]]:
    """The imported run's ids of each line, in the source model's numbering, with </s>."""
    from s2s.core.tokenizers.pieces import Pieces
    from s2s.core.tokenizers import EOS

    vocab = Pieces.load(run_dir / "pieces.src.json")
    return [[vocab.source_ids[i] for i in ids + [EOS]] for ids in vocab.encode(lines)]


def s2s_generate(run_dir: Path, input_file: Path, beam: int) -> list[str]:
    """`s2s generate RUN --input FILE decode.beam=B decode.precision=fp32`, from the shell."""
    done = subprocess.run(
        [sys.executable, "-m", "s2s.core.apps.cli", "generate", str(run_dir), "--input",
         str(input_file), f"decode.beam={beam}", "decode.precision=fp32", "run.device=cpu"],
        capture_output=True, text=True, check=True, cwd=REPO,
    )  # fmt: skip
    return done.stdout.splitlines()
