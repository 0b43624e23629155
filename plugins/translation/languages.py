"""Language codes of the translation task: lower-case ISO 639-1, and which have their own rules.

`task.src_lang` / `task.tgt_lang` name the files of a text corpus (`{prefix}.{lang}`), the
columns of WMT14 and the rules of tokenised BLEU (`moses.tokenize`). They are checked when the
config loads: an ISO 639-1 code in lower case ("de", not "DE", "deu" or "de-DE"). Any such
language may be trained (a user's own corpus); only those in `moses.RULES` tokenise with rules
of their own (abbreviations, apostrophes), the others with the generic rules, which the log and
the signature of `bleu_tok` say (`tok:moses-generic+atat`). sacreBLEU's `bleu` and `chrf` are
language-independent (13a tokenisation, characters); for Chinese, Japanese and Korean 13a does
not split words, which the log says too.
"""

from __future__ import annotations

from s2s.core import Allowed

#: the 183 codes of ISO 639-1
ISO_639_1 = frozenset(
    """
aa ab ae af ak am an ar as av ay az ba be bg bi bm bn bo br bs ca ce ch co cr cs cu cv cy da de
dv dz ee el en eo es et eu fa ff fi fj fo fr fy ga gd gl gn gu gv ha he hi ho hr ht hu hy hz ia
id ie ig ii ik io is it iu ja jv ka kg ki kj kk kl km kn ko kr ks ku kv kw ky la lb lg li ln lo
lt lu lv mg mh mi mk ml mn mr ms mt my na nb nd ne ng nl nn no nr nv ny oc oj om or os pa pi pl
ps pt qu rm rn ro ru rw sa sc sd se sg si sk sl sm sn so sq sr ss st su sv sw ta te tg th ti tk
tl tn to tr ts tt tw ty ug uk ur uz ve vi vo wa wo xh yi yo za zh zu
""".split()
)
#: where sacreBLEU's 13a tokenisation does not split words (its own tokenizers: zh, ja-mecab, ko-mecab)
UNSEGMENTED = frozenset({"zh", "ja", "ko", "th", "my", "km", "lo"})


def _hint(value) -> str:
    text = str(value)
    if text.lower() in ISO_639_1:
        return f" (did you mean {text.lower()!r}?)"
    head = text[:2].lower()
    if len(text) > 2 and text[2:3] in "-_" and head in ISO_639_1:
        return f" (without region or script: {head!r})"
    return ""


LANGUAGE = Allowed(
    lambda v: isinstance(v, str) and v in ISO_639_1,
    "a lower-case ISO 639-1 language code such as en, de, fr",
    _hint,
)
