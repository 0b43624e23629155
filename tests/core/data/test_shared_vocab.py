"""Vocabularies shared by the members of a run (multitask.shared_vocab, issue 23 items 2 and 3)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import yaml
from conftest import MULTI30K, corpus, TINY_MODEL
from s2s.core.apps.cli import main
from s2s.core.data.members import build_members
from s2s.core.data import joint
from s2s.core.setup.config import load_config
from s2s.core.training.trainer import Trainer, train

WORDS = "the a dog cat man woman sees likes runs sits big small red house park street".split()
TINY = [
    *TINY_MODEL,
    "run.quiet=true",
    "optim.max_updates=2",
    "run.valid_interval=2",
    "run.save_interval=2",
    "run.valid_max_sentences=4",
    "decode.beam=2",
]


def _sentences(n: int, seed: int, words=WORDS) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(words) for _ in range(rng.randint(3, 7))) for _ in range(n)]


def _text(folder, lang_pairs: dict, n: int = 60):
    """Parallel files {split}.{lang} in `folder`: the same made-up sentences, "translated" by a
    suffix per language (English itself for en)."""
    folder.mkdir(parents=True, exist_ok=True)
    for split, size, seed in (("train", n, 1), ("valid", 6, 2), ("test", 6, 3)):
        lines = _sentences(size, seed)
        for lang, suffix in lang_pairs.items():
            (folder / f"{split}.{lang}").write_text(
                "".join(" ".join(w + suffix for w in line.split()) + "\n" for line in lines),
                encoding="utf-8",
            )
    return folder


def _trees(folder):
    """Tiny treebank files (corpus=lines) over the same English words."""
    folder.mkdir(parents=True, exist_ok=True)
    for split, size, seed in (("train", 40, 4), ("valid", 4, 5), ("test", 4, 6)):
        lines = []
        for line in _sentences(size, seed):
            w = line.split()
            lines.append(
                f"(TOP (S (NP (DT {w[0]}) (NN {w[1]})) (VP (VBZ {w[2]}) "
                + " ".join(f"(NN {x})" for x in w[3:])
                + ")))"
            )
        (folder / f"{split}.trees").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def _preset(tmp_path, members: dict, *extra: str) -> list[str]:
    path = tmp_path / "preset.yaml"
    path.write_text(yaml.safe_dump({"tasks": members, "multitask": {"shared_vocab": True}}))
    return [
        str(path),
        [*TINY, f"run.dir={tmp_path / 'run'}", f"data.cache_dir={tmp_path / 'cache'}", *extra],
    ]


def _translation(data, src="en", tgt="de", size=300) -> dict:
    return {
        "task": {
            "name": "translation",
            "source": "text",
            "data_dir": str(data),
            "src_lang": src,
            "tgt_lang": tgt,
            "vocab_size": size,
            "train_prefix": "train",
            "valid_prefix": "valid",
            "test_prefix": "test",
        }
    }


def _parser_and_translation(tmp_path):
    """A multi-task preset: a parser whose source is a BPE of English, and English -> German."""
    data = _text(tmp_path / "text", {"en": "", "de": "en"})
    trees = _trees(tmp_path / "trees")
    parse = {
        "task": {
            "name": "parsing",
            "corpus": "lines",
            "data_dir": str(trees),
            "scheme": "tags_words",
            "constrained": True,
            "src_tokenizer": "bpe",
            "src_vocab_size": 280,
            "tokenize": False,
        }
    }
    return _preset(tmp_path, {"parse": parse, "translate": _translation(data)})


def test_the_shared_vocabulary_gives_one_id_for_a_word_two_members_both_use(registry, tmp_path):
    preset, overrides = _parser_and_translation(tmp_path)
    trainer = Trainer(load_config(preset, overrides, registry=registry), registry, quiet=True)
    p, t = trainer.members
    assert p.share == {"src": 0} and t.share == {
        "src": 0,
        "tgt": 0,
    }  # English with the same tokenizer
    assert p.task.src_vocab is t.task.src_vocab  # one vocabulary, the larger size asked for
    assert len(t.task.src_vocab) == 300
    both = ["the big dog sees a cat"]
    parsed, translated = p.encode_source(both)[0], t.encode_source(both)[0]
    assert parsed[0] != translated[0]  # each its own task token, then the same ids
    assert parsed[1:] == translated[1:] and len(parsed) > 1
    # one space, every embedding tied (section 3.4); the parse target's rows after the shared ones
    model = trainer.model
    assert model.src_embed is model.tgt_embed
    assert p.ids.src_offset == t.ids.src_offset == t.ids.tgt_offset
    assert p.ids.tgt_offset >= len(t.task.src_vocab) - 4


@pytest.mark.slow
def test_a_parser_with_a_subword_source_shared_with_translation_trains_and_parses(
    registry, tmp_path, capsys
):
    preset, overrides = _parser_and_translation(tmp_path)
    result = train(load_config(preset, overrides, registry=registry), registry, quiet=True)
    assert set(result["test"]) == {"parse", "translate"}
    src = tmp_path / "in.txt"
    src.write_text("the big dog sees a cat\nthe zebra runs\n")
    capsys.readouterr()
    assert (
        main(["generate", str(tmp_path / "run"), "--task", "parse", "--input", str(src), "-q"]) == 0
    )
    out = capsys.readouterr().out.splitlines()
    from nltk import Tree  # every source word placed, an unseen one ("zebra") included

    assert [Tree.fromstring(tree).leaves() for tree in out] == [
        line.split() for line in src.read_text().splitlines()
    ]


def test_temperature_sampling_raises_a_small_members_share_of_the_joint_vocabulary(
    registry, tmp_path
):
    # the arithmetic: member k gives N q_k lines, q_k ~ n_k^(1/T)
    r = joint.rates([1000, 10], 1.0)
    assert r == pytest.approx([1.0, 1.0])
    r = joint.rates([1000, 10], 5.0)
    share = 10 * r[1] / (1010)
    assert share == pytest.approx(10**0.2 / (1000**0.2 + 10**0.2))  # 28%, not 1%
    # the vocabulary: a big EN-DE member and a small EN-FR one whose French words only it writes
    big = _text(tmp_path / "big", {"en": "", "de": "en"}, n=400)
    small = _text(tmp_path / "small", {"en": "", "fr": "ette"}, n=8)
    french = (small / "train.fr").read_text(encoding="utf-8").splitlines()

    def tokens_per_line(temperature: float) -> float:
        preset, overrides = _preset(
            tmp_path,
            {"de": _translation(big, "en", "de", 320), "fr": _translation(small, "en", "fr", 320)},
            f"multitask.vocab_temperature={temperature}",
        )
        cfg = load_config(preset, overrides, registry=registry)
        members = build_members(cfg, registry)
        groups = joint.assign(members)
        assert groups == [
            [(0, "src"), (0, "tgt"), (1, "src"), (1, "tgt")]
        ]  # one joint vocabulary: en, de, fr
        joint.build(members, groups, cfg, cfg.data)
        vocab = members[1].task.joint["src"]
        assert vocab is members[0].task.joint["tgt"]
        return float(np.mean([len(ids) for ids in vocab.encode(french)]))

    # by size the small member's French barely gets a merge; at T = 5 its words are shorter in tokens
    assert tokens_per_line(5.0) < 0.8 * tokens_per_line(1.0)


@pytest.mark.slow
def test_the_multilingual_preset_trains_and_generate_serves_each_direction(
    registry, tmp_path, capsys
):
    data = corpus(MULTI30K)
    overrides = [
        *TINY,
        "optim.max_updates=4",
        f"run.dir={tmp_path / 'run'}",
        f"data.cache_dir={tmp_path / 'cache'}",
        *(
            f"tasks.{m}.task.{k}"
            for m in ("de", "fr")
            for k in (f"data_dir={data}", "vocab_size=600")
        ),
    ]
    cfg = load_config("multi30k_en_de_fr", overrides, registry=registry)
    result = train(cfg, registry, quiet=True)
    assert set(result["test"]) == {"de", "fr"} and sum(result["member_updates"].values()) == 4
    vocab = tmp_path / "run" / "vocab"
    assert (vocab / "de" / "tokenizer.json").read_bytes() == (
        vocab / "fr" / "tokenizer.json"
    ).read_bytes()
    src = tmp_path / "in.txt"
    src.write_text("A man is riding a bike.\nTwo dogs play in the snow.\n")
    for direction in ("de", "fr"):
        capsys.readouterr()
        assert (
            main(
                ["generate", str(tmp_path / "run"), "--task", direction, "--input", str(src), "-q"]
            )
            == 0
        )
        assert len(capsys.readouterr().out.splitlines()) == 2
