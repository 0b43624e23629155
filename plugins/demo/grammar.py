"""A small synthetic grammar: sentences, their trees and a reordered "translation".

One generator feeds both demo modes. The source language is English-like (subject, verb,
object; adjectives before nouns); the target language has its own words, puts the verb last
(S O V) and the adjectives after the noun, so a model must learn both a lexicon and long
reorderings. The same sentences with their trees make a parsing problem.
"""

from __future__ import annotations

import random

LEXICON = {  # source word -> (part of speech, target word)
    "the": ("DT", "de"),
    "a": ("DT", "en"),
    "every": ("DT", "jeder"),
    "cat": ("NN", "kat"),
    "dog": ("NN", "hond"),
    "bird": ("NN", "fogel"),
    "man": ("NN", "mann"),
    "woman": ("NN", "frou"),
    "child": ("NN", "kint"),
    "horse": ("NN", "perd"),
    "fish": ("NN", "fisk"),
    "tree": ("NN", "boom"),
    "house": ("NN", "hus"),
    "ball": ("NN", "bal"),
    "car": ("NN", "wagen"),
    "book": ("NN", "boek"),
    "river": ("NN", "stroom"),
    "hill": ("NN", "berg"),
    "sees": ("VBZ", "siet"),
    "likes": ("VBZ", "mag"),
    "chases": ("VBZ", "jaagt"),
    "finds": ("VBZ", "findt"),
    "holds": ("VBZ", "hout"),
    "watches": ("VBZ", "kikt"),
    "follows": ("VBZ", "folgt"),
    "greets": ("VBZ", "groet"),
    "big": ("JJ", "grot"),
    "small": ("JJ", "lyt"),
    "red": ("JJ", "rod"),
    "old": ("JJ", "ald"),
    "young": ("JJ", "jong"),
    "happy": ("JJ", "blij"),
    "green": ("JJ", "gruen"),
    "near": ("IN", "bij"),
    "under": ("IN", "onder"),
    "behind": ("IN", "achter"),
    "with": ("IN", "mit"),
}
BY_TAG: dict[str, list[str]] = {}
for _word, (_tag, _) in LEXICON.items():
    BY_TAG.setdefault(_tag, []).append(_word)


def noun_phrase(rng: random.Random, depth: int) -> tuple:
    """NP -> DT JJ* NN (PP)?; a tree is (label, children) with (tag, word) leaves."""
    kids = [("DT", rng.choice(BY_TAG["DT"]))]
    kids += [("JJ", rng.choice(BY_TAG["JJ"])) for _ in range(rng.choice((0, 0, 1, 2)))]
    kids.append(("NN", rng.choice(BY_TAG["NN"])))
    if depth > 0 and rng.random() < 0.3:
        kids.append(("PP", [("IN", rng.choice(BY_TAG["IN"])), noun_phrase(rng, depth - 1)]))
    return ("NP", kids)


def sentence(rng: random.Random, depth: int = 2) -> tuple:
    """S -> NP VP; VP -> VBZ NP (PP)?"""
    vp = [("VBZ", rng.choice(BY_TAG["VBZ"])), noun_phrase(rng, depth)]
    if rng.random() < 0.3:
        vp.append(("PP", [("IN", rng.choice(BY_TAG["IN"])), noun_phrase(rng, depth - 1)]))
    return ("S", [noun_phrase(rng, depth), ("VP", vp)])


def words(tree) -> list[str]:
    label, kids = tree
    return [kids] if isinstance(kids, str) else [w for k in kids for w in words(k)]


def translate(tree) -> list[str]:
    """The target sentence: target words, verb last in its VP, adjectives after their noun."""
    label, kids = tree
    if isinstance(kids, str):
        return [LEXICON[kids][1]]
    if label == "VP":
        kids = kids[1:] + kids[:1]
    elif label == "NP":
        adjs = [k for k in kids if k[0] == "JJ"]
        rest = [k for k in kids if k[0] != "JJ"]
        noun_at = next(i for i, k in enumerate(rest) if k[0] == "NN") + 1
        kids = rest[:noun_at] + adjs + rest[noun_at:]
    return [w for k in kids for w in translate(k)]


def bracketed(tree) -> list[str]:
    """The tree as tokens: phrases open with "(NP" and close with ")NP"; words stay, tags go."""
    label, kids = tree
    if isinstance(kids, str):
        return [kids]
    return [f"({label}"] + [t for k in kids for t in bracketed(k)] + [f"){label}"]


def spans(tokens: list[str]) -> list[tuple[str, int, int]] | None:
    """Labelled spans (label, first word, end) of a bracketed token list; None if malformed."""
    stack, out, n = [], [], 0
    for tok in tokens:
        if tok.startswith("("):
            stack.append((tok[1:], n))
        elif tok.startswith(")"):
            if not stack or stack[-1][0] != tok[1:]:
                return None
            label, start = stack.pop()
            out.append((label, start, n))
        else:
            n += 1
    return None if stack else out


def corpus(seed: int, size: int) -> list[tuple]:
    rng = random.Random(seed)
    return [sentence(rng) for _ in range(size)]
