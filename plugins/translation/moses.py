"""A Moses-style word tokeniser and the compound splitting of the paper's BLEU evaluation.

The paper's BLEU (27.3 / 28.4 EN-DE) was computed the way tensor2tensor's `get_ende_bleu.sh`
does it: Moses `tokenizer.perl -l <lang>` on hypothesis and reference, every hyphen between two
non-space characters rewritten as ` ##AT##-##AT## ` (so "rich-text" counts as three tokens, as in
GNMT and ConvS2S), then `multi-bleu.perl`. `tokenize` re-implements the main rules of
tokenizer.perl (v1.1, default options: no aggressive hyphen splitting): isolate every character
that is not a letter, digit, space or one of . ' ` , -; keep dot runs together; split commas
except between digits; split apostrophes by language (English "don 't", French "l' homme",
elsewhere " ' "); split a word-final period unless the word is a known abbreviation, contains
another period and a letter, or the next word starts in lower case. It does not escape & < > " '
as HTML entities (BLEU is the same either way) and its abbreviation lists are shorter than Moses's,
so on rare tokens it may differ from the Perl script.
"""

from __future__ import annotations

import re
import string

_LETTER = r"[^\W\d_]"
_NOT_LETTER = r"[\W\d_]"
_DOTS = "\ue000"  # stands for a "." inside a dot run while single periods are handled

_LETTERS = dict.fromkeys(string.ascii_uppercase, 1)
#: abbreviations whose period is kept: 1 always, 2 only before a number
NONBREAKING = {
    "en": {
        **_LETTERS,
        **dict.fromkeys(
            "Adj Adm Adv Asst Bart Bldg Brig Bros Capt Cmdr Col Comdr Con Corp Cpl DR Dr Drs Ens Gen Gov Hon "
            "Hr Hosp Insp Lt MM MR MRS MS Maj Messrs Mlle Mme Mr Mrs Ms Msgr Op Ord Pfc Ph Prof Pvt Rep Reps "
            "Res Rev Rt Sen Sens Sfc Sgt Sr St Supt Surg v vs i.e rev e.g Jan Feb Mar Apr Jun Jul Aug Sep "
            "Sept Oct Nov Dec".split(),
            1,
        ),
        **dict.fromkeys("No Nos Art Nr pp".split(), 2),
    },
    "de": {
        **_LETTERS,
        **dict.fromkeys(
            "Abs Abb Abt Adr Bd Bsp bzw ca Chr Co Dipl Dr Fa ggf Hr Hrn Hrsg inkl Jh Jhd jr Kap Mio Mr Mrd "
            "Nr Prof St Std Str Tel usw vgl zB zzgl Jan Feb Mrz Apr Jun Jul Aug Sep Sept Okt Nov Dez".split(),
            1,
        ),
        **dict.fromkeys("Art No S pp".split(), 2),
    },
    "fr": {
        **_LETTERS,
        **dict.fromkeys(
            "M MM Mme Mmes Mlle Mlles Me Mgr Dr Pr St Ste av bd boul cf chap env fig hab p vol éd".split(),
            1,
        ),
        **dict.fromkeys("no nº art pp".split(), 2),
    },
}


#: the languages with rules of their own (abbreviations and/or apostrophes); others get the generic ones
RULES = frozenset(NONBREAKING) | {"it", "ca", "ga"}


def tokenize(text: str, lang: str = "en") -> str:
    """`text` split into space-separated Moses-style tokens for language `lang` (ISO 639-1)."""
    text = re.sub(r"[\x00-\x1f]", "", re.sub(r"\s+", " ", f" {text} "))
    text = re.sub(r"\.{2,}", lambda m: f" {_DOTS * len(m.group())} ", text)
    text = re.sub(rf"([^\w\s.'`,\-{_DOTS}]|_)", r" \1 ", text)
    # commas, except inside numbers (5,300)
    text = re.sub(r"(\D),(\D)", r"\1 , \2", text)
    text = re.sub(r"(\d),(\D)", r"\1 , \2", text)
    text = re.sub(r"(\D),(\d)", r"\1 , \2", text)
    text = _apostrophes(text, lang)
    words = text.split()
    nonbreaking = NONBREAKING.get(lang, _LETTERS)
    for i, word in enumerate(words):
        if len(word) < 2 or not word.endswith("."):
            continue
        pre = word[:-1]
        after = words[i + 1] if i + 1 < len(words) else ""
        if (
            ("." in pre and re.search(_LETTER, pre))
            or nonbreaking.get(pre) == 1
            or after[:1].islower()
        ):
            continue
        if nonbreaking.get(pre) == 2 and after[:1].isdigit():
            continue
        words[i] = f"{pre} ."
    text = re.sub(r"\.' ?$", " . ' ", " ".join(words))
    return " ".join(text.split()).replace(_DOTS, ".")


def _apostrophes(text: str, lang: str) -> str:
    L, N = _LETTER, _NOT_LETTER
    if lang == "en":  # don't -> don 't ; 1990's -> 1990 's
        text = re.sub(rf"({N})'({N})", r"\1 ' \2", text)
        text = re.sub(rf"([\W_])'({L})", r"\1 ' \2", text)
        text = re.sub(rf"({L})'({N})", r"\1 ' \2", text)
        text = re.sub(rf"({L})'({L})", r"\1 '\2", text)
        return re.sub(r"(\d)'(s)", r"\1 '\2", text)
    if lang in ("fr", "it", "ca", "ga"):  # l'homme -> l' homme
        text = re.sub(rf"({N})'({N})", r"\1 ' \2", text)
        text = re.sub(rf"({N})'({L})", r"\1 ' \2", text)
        text = re.sub(rf"({L})'({N})", r"\1 ' \2", text)
        return re.sub(rf"({L})'({L})", r"\1' \2", text)
    return text.replace("'", " ' ")


def split_compounds(tokens: str) -> str:
    """`a-b` -> `a ##AT##-##AT## b`, as Perl's `s{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g` does it
    (matches do not overlap: "a-b-c" -> "a ##AT##-##AT## b-c")."""
    return re.sub(r"(\S)-(\S)", r"\1 ##AT##-##AT## \2", tokens)
