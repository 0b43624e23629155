"""What a command that finished its work says to a person: the figures, the files it wrote, and
the commands that come next. The machine-readable forms stay where they were (`--json`,
result.json, metrics.jsonl); these lines are for reading."""

from __future__ import annotations

import importlib.util
import json

import shlex
from pathlib import Path

from ..contract.task import Score


def _arg(path) -> str:
    """A path as a shell argument."""
    return shlex.quote(str(path))


def tested(result: dict) -> dict[str, Score]:
    """The test figures of a result.json, by member ("" for a single task)."""
    test = result.get("test") or {}
    if test and all(isinstance(v, dict) for v in test.values()):
        return {member: Score.from_dict(record) for member, record in test.items()}
    return {"": Score.from_dict(test)} if test else {}


def chosen(result: dict) -> str:
    """Which checkpoint was tested and why, in one sentence."""
    name, dev = result.get("checkpoint"), result.get("dev_select", {})
    if name is None:
        return "no checkpoint was written (no update ran)"
    why = (
        f"the average of the last {result['averaged']} checkpoints"
        if result.get("averaged")
        else None
    )
    others = [f"{other} {figure:.2f}" for other, figure in dev.items() if other != name]
    if name.endswith("checkpoint_best.pt"):
        why = f"the best validated model (update {result.get('best_update')})"
    text = f"tested {name}" + (f", {why}" if why else "")
    if name in dev:
        text += f": dev figure {dev[name]:.2f}"
        text += f" against {', '.join(others)}" if others else ", the only candidate"
        text += " (lower is better)" if result.get("select_higher_is_better") is False else ""
    return text


def train_lines(result: dict, run_dir: Path, preset: str) -> list[str]:
    """The end of `s2s train`: updates, the tested checkpoint and why, each member's test
    figures with their signature, the files written, and the next commands, each of which runs
    as printed (on the test split's files the run wrote; the run loads its own plugin)."""
    run = _arg(run_dir)
    skipped = result.get("skipped_updates", 0)
    lines = [
        f"trained {preset} to update {result.get('update', 0)}"
        + (f" ({skipped} skipped: a non-finite gradient)" if skipped else "")
        + f"; run directory {run_dir}",
        chosen(result),
    ]
    scores = tested(result)
    for member, score in scores.items():
        lines.append(f"test figures{f' of {member}' if member else ''}:")
        lines += [f"  {line}" for line in score.lines()]
    test = {m: run_dir / f"test{f'.{m}' if m else ''}" for m in scores}
    hyps = [f"{t}.hyp.txt" for t in test.values()]
    beside = [f"{t}.{kind}.txt" for t in test.values() for kind in ("ref", "src")]
    written = [*hyps, *beside, str(run_dir / "result.json"), str(run_dir / "metrics.jsonl")]
    lines.append(f"wrote {', '.join(written)}")
    lines.append("next:")
    if test:
        member, split = next(iter(test.items()))
        task = f" --task {member}" if len(scores) > 1 else ""
        lines.append(
            f"  s2s generate {run} --input {_arg(f'{split}.src.txt')}{task}     # or your own lines"
        )
        if len(test) == 1:
            lines.append(
                f"  s2s score {run} --ref {_arg(f'{split}.ref.txt')} --hyp {_arg(hyps[0])} "
                f"--src {_arg(f'{split}.src.txt')}     # the test figures again"
            )
    lines.append(f"  s2s plot {run}     # learning curves as PNG files")
    if len(scores) <= 1:  # the export formats have no place for a multi-task run's members
        # CTranslate2 where it is installed (the export extra), else safetensors (no extra)
        to = "ctranslate2" if importlib.util.find_spec("ctranslate2") else "safetensors"
        out = _arg(f"{run_dir}.{to}")
        lines.append(f"  s2s export {run} --to {to} --output {out}     # deploy")
    lines.append(f"  s2s serve {run}     # a page and a JSON endpoint on 127.0.0.1:8000")
    return lines


def written_lines(paths, use: str) -> list[str]:
    """The end of a command that writes files: each file by name, then what to do with them."""
    paths = [str(p) for p in paths]
    if not paths:
        return ["wrote nothing"]
    return ["wrote:", *(f"  {p}" for p in paths), use]


#: the lines that load an export, by format ({out}: its folder)
LOADERS = {
    "huggingface": [
        "from transformers import AutoTokenizer, {model}",
        'tokenizer = AutoTokenizer.from_pretrained("{out}")',
        'model = {model}.from_pretrained("{out}")',
    ],
    "safetensors": [
        "from s2s.core.inference.formats.safetensors import load_safetensors",
        'model = load_safetensors("{out}")  # the engine\'s Transformer',
    ],
}


def _ctranslate2_loader(out: Path, run_dir) -> list[str]:
    """The lines that load a CTranslate2 export and its source tokenizer (or word list; an
    import's: the run that decodes it as `s2s generate` does)."""
    translator = f'translator = ctranslate2.Translator("{out}")'
    for name in ("tokenizer.json", "tokenizer.src.json"):
        if (out / name).exists():
            return [
                "import ctranslate2, tokenizers",
                translator,
                f'tokenizer = tokenizers.Tokenizer.from_file("{out / name}")',
            ]
    if not (out / "vocab.json").exists():  # an import's pieces or Moses+BPE: s2s's own files
        return [
            "import ctranslate2",
            "from s2s.core.inference import load_run",
            "from s2s.core.inference.deployed import decode_ctranslate2",
            translator,
            f'ids = decode_ctranslate2(translator, load_run("{run_dir}").decoder, lines)',
        ]
    return [
        "import ctranslate2, json",
        translator,
        f'vocab = json.load(open("{out / "vocab.json"}"))  # the words',
    ]


def export_lines(run_dir, to: str, out: Path) -> list[str]:
    """The end of `s2s export`: the files written and the lines that load them."""
    out = Path(out)
    files = sorted(p for p in out.rglob("*") if p.is_file())
    model = "MarianMTModel"  # a Hugging Face export's class, or M2M100's for an NLLB import
    if to == "huggingface" and (out / "config.json").is_file():
        saved = json.loads((out / "config.json").read_text("utf-8"))
        model = (saved.get("architectures") or [model])[0]
    loader = (
        _ctranslate2_loader(out, run_dir)
        if to == "ctranslate2"
        else [line.format(out=out, model=model) for line in LOADERS[to]]
    )
    where = "docs/export.md has the loop that decodes as `s2s generate --beam 1` does"
    if model == "M2M100ForConditionalGeneration":
        where = "docs/pretrained.md: generate with forced_bos_token_id, the target code's id"
    return [
        f"exported {run_dir} as {to} into {out}",
        *written_lines(files, "load it in Python with:"),
        *(f"  {line}" for line in loader),
        where,
    ]
