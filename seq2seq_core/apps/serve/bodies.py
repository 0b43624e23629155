"""The request bodies each endpoint reads, as typed pydantic models: what a field holds (a
string, a whole number, a list of at most so many) is declared once here, and pydantic checks
it; its first complaint becomes one 4xx line naming the field and the value.

pydantic is the library Starlette's users reach for (FastAPI is built on it): its errors carry
the location of the bad value inside the body, which is what a one-line error must name
(`complaint`). The checks that need the run (the task's name, "nbest" against the beam, a
prefix the vocabulary cannot spell) follow in `requests`, on the parsed body."""

from __future__ import annotations

import difflib
import json
from dataclasses import fields
from typing import Annotated, Literal, get_type_hints

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    create_model,
)
from pydantic_core import PydanticCustomError

from ...decode.mbr import METHODS, UTILITIES
from ...decode.sampling import Sampling

MAX_SENTENCES = 64  # sentences a request
MAX_CHARS = 2000  # characters a sentence
MAX_SAMPLES = 16  # outputs drawn a sentence ("sampling" with "nbest")
MAX_TERMS = 32  # source/target term pairs a request ("terms"), identical ones merged
MAX_TERM_PAIRS = 4 * MAX_TERMS  # term pairs a request as sent, before any is read
MAX_BODY = 1 << 20  # bytes a request body
MAX_WEIGHTS = 400_000  # attention weights an /attention answer may hold (about 3 MB of JSON)


def _one_line(text: str) -> str:
    """A sentence that is one line (the decoder reads one line a source)."""
    if "\n" in text or "\r" in text:
        raise PydanticCustomError("line_break", "holds a line break: send one line a string")
    return text


def _not_blank(text: str) -> str:
    if not text.strip():
        raise PydanticCustomError("blank", "is blank: send a term's words")
    return text


def _one_sentence(value):
    """/attention's "text": one sentence, sent as a string or as a list of one."""
    if isinstance(value, list):
        if len(value) != 1:
            raise PydanticCustomError("one", "must be one sentence (a string)")
        return value[0]
    return value


def _whole(value):
    """A JSON number that is a whole number written as a float (7.0, 1e3: what Python's
    json.dumps and Java's clients send for whole numbers) as that int; any other value as it is,
    for the strict int to take or refuse (2.5 is not whole, true is not 1, and a float beyond
    2^53 stands for no one whole number)."""
    if type(value) is float and value.is_integer() and abs(value) <= 2**53:
        return int(value)
    return value


#: a whole number, sent as 7 or 7.0
Whole = Annotated[int, BeforeValidator(_whole)]
Line = Annotated[str, Field(max_length=MAX_CHARS), AfterValidator(_one_line)]
Sentences = Annotated[list[Line], Field(min_length=1, max_length=MAX_SENTENCES)]
Term = Annotated[str, Field(max_length=MAX_CHARS), AfterValidator(_not_blank)]


class Body(BaseModel):
    """Strict: a JSON number is not a string, 2.0 is not a whole number, true is not 1; a field
    the endpoint does not read is refused (a misspelt "nbset" would otherwise be ignored and the
    answer silently not the one asked for)."""

    model_config = ConfigDict(extra="forbid", strict=True)


def _typed(hint):
    """A field's type in a body: a whole number as `Whole` (7.0 taken), else as declared."""
    return Whole if hint is int else hint


#: the "sampling" object: `Sampling`'s fields, types and defaults (their bounds are checked as
#: the command line checks them, by `Sampling.problem`)
SamplingBody = create_model(
    "SamplingBody",
    __base__=Body,
    **{f.name: (_typed(get_type_hints(Sampling)[f.name]), f.default) for f in fields(Sampling)},
)


class GenerateBody(Body):
    """POST /generate: the sentences, and how to decode them."""

    text: Sentences
    task: str | None = None
    nbest: Annotated[Whole, Field(ge=1)] = 1
    sampling: SamplingBody | None = None
    mbr: Literal[UTILITIES] | None = None
    mbr_method: Literal[METHODS] | None = None  # with "mbr"; None: pairwise
    prefixes: (
        Annotated[
            list[Annotated[str, Field(max_length=MAX_CHARS)]], Field(max_length=MAX_SENTENCES)
        ]
        | None
    ) = None
    terms: (
        Annotated[
            list[Annotated[list[Term], Field(min_length=2, max_length=2)]],
            Field(max_length=MAX_TERM_PAIRS),
        ]
        | None
    ) = None
    # a multilingual model's languages for this request (NLLB-200: "fra_Latn"; M2M100: "fr"):
    # one server, many directions; None: the server's (decode.src_lang, decode.tgt_lang)
    src_lang: Annotated[str, Field(max_length=32)] | None = None
    tgt_lang: Annotated[str, Field(max_length=32)] | None = None


class ScoreBody(Body):
    """POST /score: the sentences and one output each to score."""

    text: Sentences
    targets: Annotated[list[Line], Field(max_length=MAX_SENTENCES)]
    task: str | None = None


class AttentionBody(Body):
    """POST /attention: one sentence and the decoder layer (the last if not given)."""

    text: Annotated[Line, BeforeValidator(_one_sentence)]
    task: str | None = None
    layer: Annotated[Whole, Field(ge=1)] | None = None


BODIES = {"/generate": GenerateBody, "/score": ScoreBody, "/attention": AttentionBody}


def complaint(endpoint: str, errors: list[dict]) -> tuple[int, str]:
    """pydantic's `errors` about `endpoint`'s body as one HTTP status and one line naming the
    field, the value and what it should be: a 413 for a body over the limits, else a 400."""
    # a misspelt field first: it explains the field that then seems missing
    error = min(errors, key=lambda err: err["type"] != "extra_forbidden")
    kind, loc = error["type"], error["loc"]
    too_large = kind == "string_too_long" or (kind, loc) == ("too_long", ("text",))
    status = 413 if too_large else 400
    return status, _message(BODIES[endpoint], endpoint, error)


def _where(loc: tuple) -> str:
    """A location inside the body as the client writes it: "text"[1], "sampling"."seed"."""
    return "".join(f"[{part}]" if isinstance(part, int) else f'."{part}"' for part in loc)[1:]


def json_shown(value) -> str:
    """A JSON value as a client would recognise it in a message."""
    kinds = {str: "string", int: "number", float: "number", list: "list", dict: "object"}
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, (list, dict)):
        return f"a JSON {kinds[type(value)]}"
    text = json.dumps(value)
    text = text if len(text) <= 40 else text[:40] + "..."
    return f"the JSON {kinds.get(type(value), type(value).__name__)} {text}"


WANTED = {  # what a value of the wrong type should have been
    "string_type": "a string",
    "list_type": "a list",
    "model_type": "an object",
    "dict_type": "an object",
    "int_type": "a whole number",
    "float_type": "a number",
}


def _message(model: type[Body], endpoint: str, error: dict) -> str:
    kind, loc, value, ctx = error["type"], error["loc"], error["input"], error.get("ctx", {})
    where = _where(loc)
    if kind == "missing":
        return f'no {where} in the request: send {{"text": ["a sentence", ...]}}'
    if kind == "extra_forbidden":
        return _unknown(model, endpoint, loc)
    if kind == "float_type" and isinstance(value, int) and not isinstance(value, bool):
        return f"{where} is {json_shown(value)}, beyond a float's range"
    if kind == "string_unicode":
        return f"{where} is not valid UTF-8 text (it holds a lone surrogate)"
    if kind in WANTED:
        return f"{where} is {json_shown(value)}, not {WANTED[kind]}"
    if kind == "literal_error":
        return f"{where} is {json_shown(value)}, not one of {ctx['expected']}"
    if kind == "too_short":
        return f"{where} holds {ctx['actual_length']} items; at least {ctx['min_length']}"
    if kind == "too_long":
        return f"{where} holds {ctx['actual_length']} items; at most {ctx['max_length']}"
    if kind == "string_too_long":
        return f"{where} has {len(value)} characters; at most {ctx['max_length']}"
    if kind == "greater_than_equal":
        return f"{where} is {json_shown(value)}; at least {ctx['ge']}"
    return f"{where} {error['msg']}"  # our own checks (a line break, a blank term) say it all


def _unknown(model: type[Body], endpoint: str, loc: tuple) -> str:
    """A field the body (or its "sampling" object) does not read, naming the nearest one it
    does."""
    where = endpoint
    if loc[:-1] == ("sampling",):
        model, where = SamplingBody, '"sampling"'
    names = list(model.model_fields)
    key = loc[-1]
    near = difflib.get_close_matches(str(key), names, n=1, cutoff=0.5)
    hint = f' (did you mean "{near[0]}"?)' if near else ""
    listed = ", ".join(names)
    return f"{json.dumps(key)[:40]} is not a field of {where}{hint}: its fields are {listed}"
