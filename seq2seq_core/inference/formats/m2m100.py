"""NLLB-200 and M2M100 models (transformers' M2M100ForConditionalGeneration) as s2s runs.

Both are fairseq's Transformer in transformers' layout, read into the one Transformer with its
options: pre-norm with a final layer norm on each side (model.pre_norm), sinusoids offset past
the padding index (model.positions=offset_sinusoid), embeddings scaled by sqrt(d_model) or not
(model.scale_embedding), stacks of their own depths, every embedding and the output projection
one matrix. The tokenizer is read with the sentencepiece library in fairseq's numbering, as
NllbTokenizer and M2M100Tokenizer give ids: <s> <pad> </s> <unk>, then the pieces (NLLB: one
past sentencepiece's own ids; M2M100: as vocab.json numbers them), then the language codes
(NLLB: as tokenizer.json or the tokenizer's config lists them; M2M100: its 100 or WMT21's 8
codes, __de__), then M2M100's made-up words and any rows the embeddings hold beyond. In s2s's
ids (s2s.core.tokenizers.pieces): fairseq's <pad>, </s>, <unk> are PAD, EOS, UNK; BOS, the decoder's
start, is a copy of </s> (transformers' decoder_start_token_id), its output logit -inf; fairseq's
<s> is the token "<bos>". The source's language code starts every source, the target's is
forced as the decoder's first output, scored 0 as transformers' forced_bos_token_id scores it
(decode.src_lang, decode.tgt_lang; the import's languages are the default). Dropout and
layer-drop values are recorded: dropout and attention_dropout in the model section, the rest in
the run's `origin`. What maps and what is refused: docs/pretrained.md, "NLLB-200 and M2M100".
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from ...tokenizers import BOS
from ...tokenizers.pieces import Pieces
from ...errors import ConfigError, DataError, ExportError, ImportModelError
from ...files import sha256
from .common import (
    ImportJob,
    Imported,
    checked_weight,
    depths,
    layer_weights,
    read_json,
    read_weights,
    transformers_shape,
)

#: the options of transformers' M2M100Config (and its PretrainedConfig's) a config.json may hold;
#: any other is refused: its meaning would be lost
KNOWN = frozenset(
    """_name_or_path activation_dropout activation_function architectures attention_dropout
    bos_token_id chunk_size_feed_forward d_model decoder_attention_heads decoder_ffn_dim
    decoder_layerdrop decoder_layers decoder_start_token_id dropout dtype torch_dtype
    encoder_attention_heads encoder_ffn_dim encoder_layerdrop encoder_layers eos_token_id id2label
    init_std is_encoder_decoder label2id max_position_embeddings model_type output_attentions
    output_hidden_states pad_token_id problem_type return_dict scale_embedding tie_word_embeddings
    transformers_version use_cache vocab_size num_hidden_layers max_length num_beams early_stopping
    gradient_checkpointing tokenizer_class output_past""".split()
)
#: M2M100Tokenizer's language lists (tokenizer_config.json's language_codes), in id order
M2M100_CODES = {
    "m2m100": """af am ar ast az ba be bg bn br bs ca ceb cs cy da de el en es et fa ff fi fr fy
    ga gd gl gu ha he hi hr ht hu hy id ig ilo is it ja jv ka kk km kn ko lb lg ln lo lt lv mg mk
    ml mn mr ms my ne nl no ns oc or pa pl ps pt ro ru sd si sk sl so sq sr ss su sv sw ta th tl
    tn tr uk ur uz vi wo xh yi yo zh zu""".split(),
    "wmt21": "en ha is ja cs ru zh de".split(),
}
NLLB_CODE = re.compile(r"^[a-z]{3}_[A-Z][a-z]{3}$")  # FLORES-200's: eng_Latn
FAIRSEQ = ["<s>", "<pad>", "</s>", "<unk>"]
SPM = "sentencepiece.bpe.model"
ACTIVATIONS = {"relu": "relu", "swish": "swish", "silu": "swish"}


def is_m2m100(folder: Path) -> bool:
    """Whether `folder` holds an M2M100ForConditionalGeneration (NLLB-200's class too)."""
    path = folder / "config.json"
    return path.is_file() and read_json(path).get("model_type") == "m2m_100"


def read(job: ImportJob, folder: Path, revision: str | None) -> Imported:
    """An NLLB-200 or M2M100 model in `folder` (a hub snapshot or a saved model)."""
    where = folder / "config.json"
    model_cfg = read_json(where)
    unknown = sorted(set(model_cfg) - KNOWN)
    if unknown:
        raise ImportModelError(
            f"{where}: unknown option {unknown[0]!r} (={model_cfg[unknown[0]]!r}) for an M2M100 / "
            "NLLB-200 model: s2s would lose its meaning"
        )
    rows = int(_need(model_cfg, "vocab_size", where))
    tokens, languages, specials, files, tok_cfg = _tokens(folder, rows)
    src_lang = job.src_lang or tok_cfg.get("src_lang")
    tgt_lang = job.tgt_lang or tok_cfg.get("tgt_lang")
    if not src_lang or not tgt_lang:
        raise ImportModelError(
            f"{folder}: the languages are not recorded (tokenizer_config.json's src_lang, "
            "tgt_lang): give --src-lang and --tgt-lang (e.g. eng_Latn and fra_Latn for NLLB-200, "
            "en and fr for M2M100)"
        )
    proto = (folder / SPM).read_bytes()
    source_ids = [1, -1, 2, 3, 0] + list(range(4, len(tokens)))
    ours = ["<pad>", "<s>", "</s>", "<unk>", "<bos>"] + tokens[4:]
    sides = []
    for lang, option in ((src_lang, "--src-lang"), (tgt_lang, "--tgt-lang")):
        try:
            sides.append(Pieces(proto, ours, source_ids, languages, ["<bos>", *specials], lang))
        except ConfigError as e:
            raise ImportModelError(
                f"{folder}: {str(e).replace('lang=', f'{option} ', 1)}"
            ) from None
        except DataError as e:
            raise ImportModelError(f"{folder / SPM}: {e}") from None
    config = _config(model_cfg, folder, len(ours), src_lang, tgt_lang)
    weights_file, weights = read_weights(folder)
    files = [where, weights_file, *files]
    origin = {
        "format": "nllb" if NLLB_CODE.match(next(iter(languages))) else "m2m100",
        "source": job.source,
        "revision": revision or "",
        "files": {f.name: sha256(f) for f in files},
        # what training did that s2s has no setting for: recorded, not applied
        "training": {
            k: float(model_cfg.get(k, 0.0))
            for k in ("activation_dropout", "encoder_layerdrop", "decoder_layerdrop")
        },
    }
    return Imported(
        config,
        origin,
        sides[0],
        sides[1],
        lambda model: _state(model, weights, source_ids, rows, weights_file),
        weights_file,
        where,
    )


def _need(cfg: dict, key: str, where: Path):
    if cfg.get(key) is None:
        raise ImportModelError(f"{where}: {key!r} is missing")
    return cfg[key]


def _tokens(folder: Path, rows: int) -> tuple[list[str], dict, list[str], list[Path], dict]:
    """fairseq's token of every embedding row, the languages (name -> token), the other special
    tokens, the tokenizer's files read and its config."""
    import sentencepiece

    tok_path = folder / "tokenizer_config.json"
    tok_cfg = read_json(tok_path) if tok_path.is_file() else {}
    spm_path = folder / SPM
    if not spm_path.is_file():
        raise ImportModelError(
            f"{spm_path} is missing: an NLLB-200 or M2M100 folder holds its sentencepiece model"
        )
    try:
        spm = sentencepiece.SentencePieceProcessor(model_proto=spm_path.read_bytes())
    except Exception as e:  # noqa: BLE001 -- sentencepiece's errors on a damaged model
        raise ImportModelError(f"{spm_path}: not a sentencepiece model ({e})") from None
    files = [spm_path] + ([tok_path] if tok_path.is_file() else [])
    vocab_path = folder / "vocab.json"
    if vocab_path.is_file():  # M2M100: vocab.json numbers the pieces
        vocab = read_json(vocab_path)
        by_id = sorted(vocab, key=vocab.get)
        if [vocab[t] for t in by_id] != list(range(len(by_id))) or by_id[:4] != FAIRSEQ:
            raise ImportModelError(
                f"{vocab_path}: not fairseq's dictionary (ids 0, 1, ... from {FAIRSEQ})"
            )
        kind = tok_cfg.get("language_codes", "m2m100")
        if kind not in M2M100_CODES:
            raise ImportModelError(
                f"{tok_path}: language_codes={kind!r} (M2M100Tokenizer's are "
                f"{', '.join(M2M100_CODES)})"
            )
        languages = {code: f"__{code}__" for code in M2M100_CODES[kind]}
        madeup = [f"madeupword{i:04d}" for i in range(int(tok_cfg.get("num_madeup_words", 8)))]
        tokens = by_id + list(languages.values()) + madeup
        specials = madeup
        files.append(vocab_path)
    else:  # NLLB-200: sentencepiece's pieces one past its own ids
        if not (spm.is_unknown(0) and spm.is_control(1) and spm.is_control(2)):
            raise ImportModelError(
                f"{spm_path}: its first ids are not <unk> <s> </s> (fairseq's offset of one)"
            )
        tokens = FAIRSEQ + [spm.id_to_piece(i) for i in range(3, spm.get_piece_size())]
        added = _added_tokens(folder, tok_cfg, tokens)
        for i, token in sorted(added.items()):
            if i != len(tokens):
                raise ImportModelError(
                    f"{folder}: the tokenizer's token {token!r} has id {i}, not {len(tokens)} "
                    "(language codes follow the pieces)"
                )
            tokens.append(token)
        languages = {t: t for t in added.values() if NLLB_CODE.match(t)}
        specials = [t for t in added.values() if t not in languages]
        if (folder / "tokenizer.json").is_file():
            files.append(folder / "tokenizer.json")
    if not languages:
        raise ImportModelError(f"{folder}: the tokenizer lists no language codes")
    if len(tokens) > rows:
        raise ImportModelError(
            f"{folder / 'config.json'}: vocab_size={rows} rows, but the tokenizer holds "
            f"{len(tokens)} tokens ({len(languages)} language codes after the pieces): its "
            "language list disagrees with the embeddings"
        )
    extra = [f"<row{i}>" for i in range(len(tokens), rows)]  # rows no token names
    return tokens + extra, languages, specials + extra, files, tok_cfg


def _added_tokens(folder: Path, tok_cfg: dict, pieces: list[str]) -> dict[int, str]:
    """NLLB's tokens after the pieces, by id: tokenizer.json's added tokens where it is there
    (its pieces checked to be sentencepiece's with fairseq's offset); else the language codes
    the tokenizer's config lists, then <mask> (fairseq's order)."""
    first = len(pieces)
    path = folder / "tokenizer.json"
    if path.is_file():
        document = read_json(path)
        added = {}
        for entry in document.get("added_tokens") or []:
            if isinstance(entry, dict) and isinstance(entry.get("id"), int):
                added[entry["id"]] = str(entry.get("content"))
        vocab = (document.get("model") or {}).get("vocab") or {}
        for token, i in vocab.items() if isinstance(vocab, dict) else ():
            if isinstance(i, int) and 4 <= i < first and pieces[i] != token:
                raise ImportModelError(
                    f"{path}: {token!r} has id {i}, but {SPM} with fairseq's offset gives that "
                    f"id to {pieces[i]!r}: not NLLB's layout"
                )
            if isinstance(i, int) and i >= first:
                added.setdefault(i, token)
        return {i: t for i, t in added.items() if i >= first}
    listed = next(
        (
            tok_cfg[k]
            for k in ("additional_special_tokens", "extra_special_tokens")
            if tok_cfg.get(k)
        ),
        None,
    )
    special_map = folder / "special_tokens_map.json"
    if listed is None and special_map.is_file():
        listed = read_json(special_map).get("additional_special_tokens")
    codes = [str(t.get("content") if isinstance(t, dict) else t) for t in listed or []]
    codes = [c for c in codes if NLLB_CODE.match(c)]
    return {first + i: t for i, t in enumerate([*codes, "<mask>"] if codes else [])}


def _config(model_cfg: dict, folder: Path, n_tokens: int, src_lang: str, tgt_lang: str) -> dict:
    """The run's config as a dict: the translation task over the imported vocabulary, the model
    section of config.json, decoding as generation_config.json says (transformers' defaults
    where it is silent)."""
    where = folder / "config.json"

    def need(key):
        return _need(model_cfg, key, where)

    fixed = {"pad_token_id": 1, "eos_token_id": 2, "decoder_start_token_id": 2}
    for key, value in fixed.items():
        if int(model_cfg.get(key, value)) != value:
            raise ImportModelError(f"{where}: {key}={model_cfg[key]} (fairseq's is {value})")
    if need("encoder_ffn_dim") != need("decoder_ffn_dim"):
        raise ImportModelError(
            f"{where}: encoder_ffn_dim={need('encoder_ffn_dim')} but decoder_ffn_dim="
            f"{need('decoder_ffn_dim')}: s2s's stacks have one d_ff"
        )
    if need("encoder_attention_heads") != need("decoder_attention_heads"):
        raise ImportModelError(f"{where}: the encoder's and the decoder's heads differ")
    activation = ACTIVATIONS.get(str(model_cfg.get("activation_function", "relu")))
    if activation is None:
        raise ImportModelError(
            f"{where}: activation_function={model_cfg['activation_function']!r} is not "
            f"supported (one of {', '.join(ACTIVATIONS)})"
        )
    if not model_cfg.get("tie_word_embeddings", True):
        raise ImportModelError(
            f"{where}: tie_word_embeddings=false: s2s imports M2M100 models whose embeddings "
            "and output projection are one matrix (NLLB-200's and M2M100's are)"
        )
    gen_path = folder / "generation_config.json"
    gen = read_json(gen_path) if gen_path.is_file() else {}
    max_positions = int(need("max_position_embeddings"))
    max_length = int(gen.get("max_length", model_cfg.get("max_length") or 20))
    early = gen.get("early_stopping", model_cfg.get("early_stopping", False))
    return {
        "task": {
            "name": "translation",
            "source": "text",
            "src_lang": _iso(src_lang, "en"),
            "tgt_lang": _iso(tgt_lang, "de" if _iso(src_lang, "en") != "de" else "en"),
            "tokenizer": "sentencepiece",
            "vocab_size": n_tokens,
            "shared_vocab": True,
        },
        "model": {
            **depths(int(need("encoder_layers")), int(need("decoder_layers"))),
            "d_model": int(need("d_model")),
            "d_ff": int(need("encoder_ffn_dim")),
            "heads": int(need("encoder_attention_heads")),
            "dropout": float(model_cfg.get("dropout", 0.1)),
            "attention_dropout": float(model_cfg.get("attention_dropout", 0.0)),
            "pre_norm": True,
            "max_positions": max_positions,
            "positions": "offset_sinusoid",
            "scale_embedding": bool(model_cfg.get("scale_embedding", False)),
            "activation": activation,
            "output_bias": True,  # zero, but -inf at BOS, a copy of </s> that is never written
            "output_bias_fixed": True,  # as the source keeps it: never trained
            "tie_output": True,
        },
        "decode": {
            "beam": int(gen.get("num_beams", model_cfg.get("num_beams") or 1)),
            "alpha": float(gen.get("length_penalty", 1.0)),
            "length_penalty": "power",
            "stop": "beam" if early is True else "transformers",
            "max_len_a": 0.0,
            "max_len_b": max(1, min(max_length, max_positions) - 2),
            "src_lang": src_lang,
            "tgt_lang": tgt_lang,
        },
        "data": {"max_len": min(256, max_positions)},
        "run": {},
    }


#: ISO 639-1 codes of NLLB-200's languages whose code does not start with them, and others
ISO = {"spa": "es", "zho": "zh", "jpn": "ja", "kor": "ko", "arb": "ar", "ces": "cs", "ell": "el"}
ISO |= {"swe": "sv", "dan": "da", "heb": "he", "ukr": "uk", "pes": "fa", "zsm": "ms", "ron": "ro"}
ISO |= {"nob": "nb", "lvs": "lv", "est": "et", "slk": "sk", "slv": "sl", "srp": "sr", "cat": "ca"}
#: NLLB-200's three-letter codes that start with their ISO 639-1 code (eng: en)
SAME = set(
    """eng deu fra ita rus por pol nld tur fin hun bul vie tha ind hin isl gle lit hrv ben
    tam tel urd afr amh hye bel bos cym mkd mlt sin som kat kaz""".split()
)


def _iso(name: str, default: str) -> str:
    """The two-letter code the translation task names a language by (its corpus files,
    tokenised BLEU's rules): M2M100's code itself, NLLB's (eng_Latn) ISO 639-1 code where the
    three letters start with it (`SAME`: en) or `ISO` lists it, else `default`."""
    if len(name) == 2 and name.isalpha() and name.islower():
        return name
    head = name.split("_")[0]
    return ISO.get(head) or (head[:2] if head in SAME else default)


def _state(model, weights: dict, source_ids: list[int], rows: int, path: Path) -> dict:
    """M2M100's weights under s2s's names, rows in s2s's id order (BOS: a copy of </s>'s row);
    every tensor checked against its shape, type and finiteness."""
    w = {k.removeprefix("model."): k for k in weights}  # s2s's reading -> the file's key
    taken = set()
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}

    def get(name, shape):
        """Weight `name`, checked against the `shape` the config gives it (never cut to fit),
        floating-point and finite (`common.checked_weight`)."""
        if name not in w:
            raise ImportModelError(f"{path}: {name!r} is missing")
        taken.add(name)
        return checked_weight(path, name, weights[w[name]], shape)  # read now, one at a time

    table = get("shared.weight", (rows, shapes["src_embed.weight"][1]))
    index = torch.tensor([i if i >= 0 else 2 for i in source_ids])  # BOS: </s>'s row
    state = {"src_embed.weight": table[index]}  # indexing copies: the source's table let go
    del table
    state["tgt_embed.weight"] = state["out.weight"] = state["src_embed.weight"]
    layers = [(ours, theirs) for ours, theirs, _ in layer_weights(model)]
    layers += [("enc_norm", "encoder.layer_norm"), ("dec_norm", "decoder.layer_norm")]
    for ours, theirs in layers:
        for part in ("weight", "bias"):
            state[f"{ours}.{part}"] = get(f"{theirs}.{part}", shapes[f"{ours}.{part}"])
    state["out.bias"] = torch.zeros(len(source_ids))
    state["out.bias"][BOS] = -torch.inf  # a copy of </s> as input; never written
    tied = {"encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "lm_head.weight"}
    left = sorted(k for k in set(w) - taken - tied if "embed_positions" not in k)
    if left:
        raise ImportModelError(f"{path}: {left[0]!r} has no place in the Transformer s2s imports")
    return state


# -- back into M2M100ForConditionalGeneration ----------------------------------------------------
def numbered(vocab) -> bool:
    """Whether `vocab` is an M2M100 / NLLB-200 import's (s2s's PAD, BOS, EOS, UNK and fairseq's
    <s> numbered 1, none, 2, 3, 0 in the model's own ids, as `read` numbers them)."""
    return isinstance(vocab, Pieces) and list(vocab.source_ids[:5]) == [1, -1, 2, 3, 0]


def to_m2m100(model, cfg, task, out: Path) -> None:
    """An imported (and perhaps fine-tuned) NLLB-200 or M2M100 model back in its own class: an
    M2M100ForConditionalGeneration (config.json, model.safetensors, generation_config.json) in
    the model's own numbering, and NllbTokenizer's or M2M100Tokenizer's files, checked to give
    every token its row. What the class cannot hold is refused naming the setting."""
    try:
        from transformers import GenerationConfig, M2M100Config, M2M100ForConditionalGeneration
    except ImportError:
        raise ExportError(
            "--to huggingface needs the transformers package: pip install transformers "
            "(s2s's export extra)"
        ) from None
    m, vocab = cfg.model, task.src_vocab
    for ok, what in (
        (m.pre_norm, "model.pre_norm=false"),
        (m.positions == "offset_sinusoid", f"model.positions={m.positions}"),
        (m.d_k is None or m.d_k * m.heads == m.d_model, f"model.d_k={m.d_k}"),
        (m.d_v is None or m.d_v * m.heads == m.d_model, f"model.d_v={m.d_v}"),
        (model.out.weight is model.tgt_embed.weight is model.src_embed.weight, "untied"),
    ):
        if not ok:
            raise ExportError(
                f"{what} has no M2M100ForConditionalGeneration form: export it with --to "
                "safetensors"
            )
    order = torch.tensor(_fairseq_order(vocab))
    bias = model.out.bias.detach()[order] if model.out.bias is not None else torch.zeros(1)
    if bias.abs().max() > 0:
        raise ExportError(
            f"the output bias is not zero (largest {bias.abs().max().item():.3g}, "
            f"{vocab.itos[int(order[bias.abs().argmax()])]!r}; fine-tuning trained it): "
            "M2M100ForConditionalGeneration has none; export it with --to ctranslate2 or "
            "--to safetensors"
        )
    state = {"model.shared.weight": model.src_embed.weight.detach()[order].clone()}
    layers = [(ours, theirs) for ours, theirs, _ in layer_weights(model)]
    layers += [("enc_norm", "encoder.layer_norm"), ("dec_norm", "decoder.layer_norm")]
    params = dict(model.named_parameters())
    for ours, theirs in layers:
        for part in ("weight", "bias"):
            state[f"model.{theirs}.{part}"] = params[f"{ours}.{part}"].detach().clone()
    hf_cfg = M2M100Config(
        vocab_size=len(order),
        **transformers_shape(model, m),
        encoder_layerdrop=0.0,
        decoder_layerdrop=0.0,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=2,
        tie_word_embeddings=True,
    )
    hf = M2M100ForConditionalGeneration(hf_cfg).eval()
    missing, unexpected = hf.load_state_dict(state, strict=False)
    # not given: the tied copies of `shared` and the position tables the class computes
    left = [
        k for k in missing if "embed_positions" not in k and not k.endswith("embed_tokens.weight")
    ]
    if left != [] and left != ["lm_head.weight"] or unexpected:
        raise ExportError(f"M2M100 weights do not match: missing {left}, unexpected {unexpected}")
    d = cfg.decode
    hf.generation_config = GenerationConfig(
        decoder_start_token_id=2,
        bos_token_id=0,
        eos_token_id=2,
        pad_token_id=1,
        num_beams=int(d.beam),
        length_penalty=float(d.alpha),
        max_length=min(int(d.max_len_b) + 2, m.max_positions),
    )
    hf.save_pretrained(str(out))
    _save_tokenizer(vocab, task.tgt_vocab, out)


def _fairseq_order(vocab: Pieces) -> list[int]:
    """s2s's id of each of the model's own ids, in its order (BOS, a copy of </s>, left out)."""
    order = [0] * (len(vocab) - 1)
    for ours, theirs in enumerate(vocab.source_ids):
        if theirs >= 0:
            order[theirs] = ours
    return order


def _save_tokenizer(src: Pieces, tgt: Pieces, out: Path) -> None:
    """NllbTokenizer's (sentencepiece.bpe.model and the codes as added tokens) or
    M2M100Tokenizer's files (vocab.json too) for the import's vocabulary, the run's languages
    its src_lang and tgt_lang; every token's id checked against the model's row."""
    from transformers import AutoTokenizer

    tokens = ["<s>", "<pad>", "</s>", "<unk>"] + list(src.itos[5:])
    codes = list(src.languages.values())
    (out / SPM).write_bytes(src.model_proto)
    if NLLB_CODE.match(codes[0]):
        from transformers import NllbTokenizer

        tok = NllbTokenizer.from_pretrained(
            str(out), src_lang=src.lang, tgt_lang=tgt.lang, additional_special_tokens=codes
        )
    else:
        from transformers import M2M100Tokenizer

        kind = next((k for k, v in M2M100_CODES.items() if v == list(src.languages)), None)
        if kind is None:
            raise ExportError(
                "the import's language list is not M2M100Tokenizer's (m2m100 or wmt21): no "
                "tokenizer of transformers numbers it"
            )
        first = tokens.index(codes[0])
        words = tokens[:first]
        (out / "vocab.json").write_text(
            json.dumps({w: i for i, w in enumerate(words)}, ensure_ascii=False), "utf-8"
        )
        madeup = [t for t in src.specials if t.startswith("madeupword")]
        tok = M2M100Tokenizer(
            str(out / "vocab.json"),
            str(out / SPM),
            src_lang=src.lang,
            tgt_lang=tgt.lang,
            language_codes=kind,
            num_madeup_words=len(madeup),
        )
    tok.save_pretrained(str(out))
    tok = AutoTokenizer.from_pretrained(str(out))
    # M2M100Tokenizer has no ids for its made-up words; no text holds them or rows past them
    named = [(i, t) for i, t in enumerate(tokens) if t not in src.specials]
    got = tok.convert_tokens_to_ids([t for _, t in named])
    wrong = next(((i, t, g) for (i, t), g in zip(named, got) if g != i), None)
    if wrong is not None:
        raise ExportError(
            f"transformers' tokenizer gives {wrong[1]!r} id {wrong[2]}, the model's row is "
            f"{wrong[0]}: the export would not translate"
        )
