"""Transfer between tasks at an equal total budget (issue 23, item 4), on the presets' 2 threads.

    python bench/research/transfer_budget.py --multilingual-minutes 20 --parsing-minutes 30      # ~3 h 15 min
    python bench/research/transfer_budget.py --parts b --settings joint single                    # (b) in parts: ~70 min
    python bench/research/transfer_budget.py --parts b --settings fine_tuned                      # ~95 min; the rest is kept
    python bench/research/transfer_budget.py --parts b --settings fine_tuned --pretrain-shares 0.3333333 0.6666667  # ~65 min
    python bench/research/transfer_budget.py --parts b --settings shape    # the control, the fine-tuning run's minutes (~22 min)
    python bench/research/transfer_budget.py --parts b --settings fine_tuned shape --layers 2 --pretrain-shares 0.3333333  # ~55 min
    python bench/research/transfer_budget.py --parts b --settings fine_tuned --layers 2 --bpe 16000 --pretrain-shares 0.3333333
    python bench/research/transfer_budget.py --parts b --settings fine_tuned --layers 2 --bpe 0 --pretrain-shares 0.3333333
    python bench/research/transfer_budget.py --multilingual-minutes 1 --parsing-minutes 1 --pretrain-shares 0.5 \
        --sentences 40 --valid-interval 25 --dir runs/transfer_check --name transfer_budget_check \
        decode.beam=2                                   # the script end to end, in about half an hour

(a) Multilingual: multi30k_en_de_fr (one model, EN->DE and EN->FR, one joint BPE, the target
    language's token) for A minutes, against multi30k_en_de for A/2 plus multi30k_en_fr for A/2.
    Figures: test BLEU (sacreBLEU, test_2016_flickr) and dev BLEU per direction; target: each
    direction's ratio multilingual / bilingual >= 1.00.
(b) Parsing the treebank sample, B minutes in all, three ways: single-task ptb_sample_parsing;
    joint ptb_sample_parsing_multi30k (shared English: one BPE for the parser's source and
    Multi30k); pre-training multi30k_en_de for p*B minutes, then fine-tuning ptb_sample_parsing
    for (1-p)*B minutes from it (`run.init_from`, the pre-training model's shape, --bpe's source), p
    from --pretrain-shares chosen by dev F1 (the pre-training run resumes from one share to the
    next; each fine-tuning run starts from where it then stood). Figures: test and dev F1 over all
    sentences (f1_all) on the full splits, and EVALB against the gold trees; target: the best
    transfer setting >= single-task + 2 F1 on test, and above single-task on dev.
    The pre-training model has --layers layers (3, multi30k_en_de's; 2 is the parser's own) and a
    vocabulary of --bpe tokens (8,000, multi30k_en_de's), the parser's BPE source as many (--bpe 0:
    the parser keeps its own word source, the pre-training model its 8,000).
    A control, `--settings shape`: the fine-tuned parser's shape (--layers, --bpe's source) trained
    from scratch for the fine-tuning run's minutes at the share chosen on dev, validated as that
    run was (from update 500): what the pre-training adds to that shape (`pretraining_gain`),
    apart from what the shape costs against single-task's.
(c) The translation member's dev nll after k member updates in the joint run of (b), against the
    single-task multi30k_en_de run's after k updates (the pre-training run of (b), validated as
    often): ratio at each k the joint run validated; target: within 3% (ratio <= 1.03).

Every preset keeps its own tuning (chosen on dev); the runs go one after another, so the
machine's load touches them in turn, not alike: run it on a quiet machine. One run a setting,
not medians of several (the budget is hours). Writes bench/research/results/NAME.json (default
transfer_budget) after every run, with the machine's facts and its load average; `--parts a`
or `--parts b` runs one part and keeps the other's figures in the file, and `--settings` runs
some of (b)'s settings, in the order given, keeping the file's figures of the others.
"""

from __future__ import annotations

import s2s.core  # noqa: F401  before torch: the CPU runtime defaults (s2s.core.RUNTIME_ENV)

import argparse
import json
import os
import sys
import time
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
from s2s.core.decode.batched import Decoder  # noqa: E402
from s2s.core.data.members import decode_settings  # noqa: E402
from s2s.core.inference import load_for_inference  # noqa: E402
from s2s.core.setup.config import load_config  # noqa: E402
from s2s.core.setup.registry import Registry  # noqa: E402
from s2s.core.runs.metrics import read_metrics  # noqa: E402
from s2s.core.training.trainer import train  # noqa: E402

from bench.research.budget import gold_figures  # noqa: E402
from bench.common import corpus_overrides, machine, results_of, write  # noqa: E402


def form(r: dict) -> tuple[int, int]:
    """A (b) run's shape as the file records it: layers and BPE size (older entries: 3, 8,000)."""
    return r.get("layers", 3), r.get("bpe", 8000)


def shape(layers: int, bpe: int) -> list[str]:
    """What the fine-tuned parser (and the control) change in ptb_sample_parsing: the pre-training
    model's layers (--layers) and a BPE source of --bpe tokens, whose tokens Multi30k's English
    shares (0: the parser's own words, which carry only the rows whose strings match)."""
    return [
        f"model.layers={layers}",
        *(["task.src_tokenizer=bpe", f"task.src_vocab_size={bpe}"] if bpe else []),
    ]


VALID = 500  # updates between validations in every run: (c)'s curves (--valid-interval)
B_SETTINGS = ("single", "joint", "fine_tuned", "shape")  # (b)'s three ways, and the control
EVERY: list[str] = []  # settings for every run (the command line's overrides)


def scores(
    run_dir: str, reg, member: str | None, sentences: int = 0, splits=("valid", "test")
) -> dict:
    """Each split of a run's task (member) decoded with its defaults (the first `sentences`
    pairs; 0: all) and scored; read through the task itself, since a member with a shared
    vocabulary is prepared beneath it."""
    cfg, task, model = load_for_inference(run_dir, reg, task=member)
    out = {}
    for split in splits:
        sources, refs = map(list, zip(*task.task.read_split(split)))
        sources, refs = (sources[:sentences], refs[:sentences]) if sentences else (sources, refs)
        hyps = Decoder(
            model,
            task,
            decode_settings(task.task, cfg.decode),
            torch.device("cpu"),
            cfg.decode.max_sentences,
        ).generate(sources, postprocess=False)
        score = task.score(hyps, refs, sources)
        out[split] = {
            score.name: score.value,
            **{k: v for k, v in score.figures.items() if not k.endswith("signature")},
        }
        if task.task.name == "parsing" and split == "test":
            gold = list(task.task.references("test"))[: len(sources)]
            out["gold_evalb"] = gold_figures(gold, task.task.rebuild(hyps, sources)[0])
    return out


def run(
    reg, preset: str, minutes: float, run_dir: str, *overrides: str, sentences: int = 0
) -> dict:
    """Train (or resume) `preset` to `minutes` of training (`run.max_minutes`, across resumes):
    its updates, the checkpoint it tested and its scores (`scores`)."""
    cfg = load_config(
        preset,
        [
            *corpus_overrides(preset),
            f"run.dir={run_dir}",
            f"run.max_minutes={minutes}",
            "run.quiet=true",
            "optim.max_updates=1000000",
            f"run.valid_interval={VALID}",
            *overrides,
            *EVERY,
        ],
        registry=reg,
    )
    t0 = time.time()
    result = train(cfg, reg, quiet=True)
    row = {
        "minutes": minutes,
        "updates": result["update"],
        "member_updates": result.get("member_updates"),
        "selection": {
            k: result[k] for k in ("checkpoint", "dev_select", "best_update") if k in result
        },
        "train_wall_s": round(time.time() - t0, 1),
    }
    row["scores"] = {
        m or preset: scores(run_dir, reg, m, sentences) for m in (list(cfg.tasks or []) or [None])
    }
    return row


def dev_curve(run_dir: str, member: str | None) -> list[tuple[int, float]]:
    """(member updates, dev nll) at each validation of a run (of one member of a multi-task run)."""
    prefix = f"{member}/" if member else ""
    done, curve = 0, []
    for r in read_metrics(run_dir):
        if r["kind"] == "train":
            done = r["update"] if not member else done + r.get(f"{prefix}updates", 0)
        elif r["kind"] == "valid" and f"{prefix}nll" in r:
            curve.append((r["update"] if not member else done, r[f"{prefix}nll"]))
    return curve


def at(curve: list[tuple[int, float]], k: int) -> float | None:
    """The curve's value at k updates, linear between validations (None outside them)."""
    for (k0, v0), (k1, v1) in zip(curve, curve[1:]):
        if k0 <= k <= k1:
            return v0 + (v1 - v0) * (k - k0) / max(1, k1 - k0)
    return curve[0][1] if curve and curve[0][0] == k else None


def main() -> None:
    global VALID  # noqa: PLW0603
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--multilingual-minutes",
        type=float,
        default=20.0,
        help="(a): the multilingual run's budget",
    )
    p.add_argument(
        "--parsing-minutes",
        type=float,
        default=30.0,
        help="(b): each parsing setting's total budget",
    )
    p.add_argument(
        "--pretrain-shares",
        type=float,
        nargs="+",
        default=[1 / 3, 1 / 2, 2 / 3],
        help="(b): shares of the budget spent pre-training, one fine-tuning run each (chosen on dev)",
    )
    p.add_argument(
        "--parts",
        nargs="+",
        default=["a", "b"],
        choices=["a", "b"],
        help="(c) comes with (b)'s joint setting",
    )
    p.add_argument(
        "--settings",
        nargs="+",
        default=list(B_SETTINGS),
        choices=B_SETTINGS,
        help="(b): the settings run now; the file's figures of the others are kept",
    )
    p.add_argument(
        "--layers",
        type=int,
        default=3,
        help="(b): layers of the pre-training model, hence of the "
        "fine-tuned parser and the control (multi30k_en_de has 3, ptb_sample_parsing 2)",
    )
    p.add_argument(
        "--bpe",
        type=int,
        default=8000,
        help="(b): BPE tokens of the pre-training model's vocabulary "
        "and of the fine-tuned parser's (and the control's) source (multi30k_en_de has 8,000; more "
        "tokens keep more of the treebank's words whole; 0: the parser keeps its word source and the "
        "pre-training model its 8,000)",
    )
    p.add_argument("--dir", default="runs/transfer_budget")
    p.add_argument("--name", default="transfer_budget")
    p.add_argument(
        "--valid-interval", type=int, default=VALID, help="updates between validations, every run"
    )
    p.add_argument(
        "--sentences",
        type=int,
        default=0,
        help="score only the first N sentences of dev and test (0: all; to check the script)",
    )
    p.add_argument(
        "overrides",
        nargs="*",
        help="settings for every run (e.g. decode.beam=2 to check the script)",
    )
    p.add_argument(
        "--note", default="", help="what else ran on the machine meanwhile, for the record"
    )
    args = p.parse_intermixed_args()
    torch.set_num_threads(2)  # decoding; training uses the presets' run.threads (2)
    reg = Registry.installed()
    VALID, EVERY[:] = args.valid_interval, args.overrides
    d, n, L, V = args.dir, args.sentences, args.layers, args.bpe
    P = V or 8000  # the pre-training model's vocabulary
    pre_tag = f"{L}l" + (
        f"_bpe{P}" if P != 8000 else ""
    )  # its runs: layers, and BPE size where not 8,000
    tag = pre_tag if V else f"{L}l_words"  # the fine-tuned parser's (and the control's) runs
    pretrain = f"{d}/pretrain_{pre_tag}"  # resumed from one share to the next
    result = {
        "command": " ".join(["python", *sys.argv]),
        "note": args.note,
        "machine": machine(),
        "load_avg": [],
    }
    path = (
        results_of(__file__) / f"{args.name}.json"
    )  # the parts (and settings of (b)) not run now are kept
    previous = json.loads(path.read_text()) if path.is_file() else {}
    done = {"a"} if "a" not in args.parts else set()
    done |= (
        {"b", "c"} if "b" not in args.parts else {"c"}
    )  # (c) is written again where the joint setting runs now
    result.update({k: v for k, v in previous.items() if k in done})
    # the figures a part run now replaces stay, with the command that made them
    result["history"] = previous.get("history", []) + [
        {
            "command": previous.get("command"),
            "note": previous.get("note"),
            "load_avg": previous.get("load_avg"),
            part: previous[part],
        }
        for part in ("a", "b")
        if part in previous and part not in done
    ]

    def save(key, value):
        result[key] = value
        result["load_avg"].append([round(x, 2) for x in os.getloadavg()])
        print(f"wrote {write(args.name, result)}", flush=True)

    if "a" in args.parts:
        a, half = {}, args.multilingual_minutes / 2
        a["multilingual"] = run(
            reg, "multi30k_en_de_fr", args.multilingual_minutes, f"{d}/en_de_fr", sentences=n
        )
        save("a", a)
        a["en_de"] = run(reg, "multi30k_en_de", half, f"{d}/en_de", sentences=n)
        a["en_fr"] = run(reg, "multi30k_en_fr", half, f"{d}/en_fr", sentences=n)
        multi = a["multilingual"]["scores"]
        bilingual = {
            lang: a[f"en_{lang}"]["scores"][f"multi30k_en_{lang}"] for lang in ("de", "fr")
        }
        a["ratio"] = {
            lang: {
                split: round(multi[lang][split]["bleu"] / bilingual[lang][split]["bleu"], 3)
                if bilingual[lang][split]["bleu"]
                else None
                for split in ("valid", "test")
            }
            for lang in ("de", "fr")
        }
        a["target_met"] = {
            lang: r["test"] is not None and r["test"] >= 1.0 for lang, r in a["ratio"].items()
        }
        save("a", a)

    if "b" in args.parts:
        B = args.parsing_minutes
        b = {
            k: v
            for k, v in previous.get("b", {}).items()
            if k in B_SETTINGS and k not in args.settings
        }
        result["b"] = b  # the settings run before (kept), then those run now
        f1 = lambda r, split: r["scores"][
            "ptb_sample_parsing" if "ptb_sample_parsing" in r["scores"] else "parse"
        ][split]["f1_all"]  # noqa: E731
        for setting in args.settings:  # in the order given
            if setting == "single":
                b["single"] = run(reg, "ptb_sample_parsing", B, f"{d}/parse_single", sentences=n)
                save("b", b)
                continue
            if setting == "joint":
                b["joint"] = run(
                    reg, "ptb_sample_parsing_multi30k", B, f"{d}/parse_joint", sentences=n
                )
                save("b", b)
                continue
            if (
                setting == "shape"
            ):  # the fine-tuning run's shape and minutes, without the pre-training
                tuned = [
                    r["fine_tune"]
                    for r in (b.get("fine_tuned") or {}).values()
                    if form(r) == (L, V)
                ]
                minutes = (
                    max(tuned, key=lambda r: f1(r, "valid"))["minutes"]
                    if tuned
                    else (1 - min(args.pretrain_shares)) * B
                )
                b["shape"] = run(
                    reg,
                    "ptb_sample_parsing",
                    minutes,
                    f"{d}/parse_shape_{tag}",
                    *shape(L, V),
                    "run.valid_after=0",
                    sentences=n,
                )
                b["shape"].update(layers=L, bpe=V)
                save("b", b)
                continue
            # the file's fine-tuning runs of other shapes stay: dev chooses among all of them
            b["fine_tuned"] = {
                k: r
                for k, r in previous.get("b", {}).get("fine_tuned", {}).items()
                if form(r) != (L, V)
            }
            for share in sorted(args.pretrain_shares):
                pre = run(
                    reg,
                    "multi30k_en_de",
                    share * B,
                    pretrain,
                    f"model.layers={L}",
                    f"task.vocab_size={P}",
                    sentences=n,
                )
                tuned = run(
                    reg,
                    "ptb_sample_parsing",
                    (1 - share) * B,
                    f"{d}/parse_tuned_{tag}_{share:.2f}",
                    *shape(L, V),
                    f"run.init_from={pretrain}",
                    "run.valid_after=0",
                    sentences=n,
                )
                b["fine_tuned"][f"{tag}_{share:.2f}"] = {
                    "pretrain": pre,
                    "fine_tune": tuned,
                    "layers": L,
                    "bpe": V,
                    "share": share,
                }
                save("b", b)
        settings = {name: b[name] for name in ("single", "joint", "shape") if name in b}
        if b.get("fine_tuned"):
            chosen = max(
                b["fine_tuned"], key=lambda s: f1(b["fine_tuned"][s]["fine_tune"], "valid")
            )
            settings["fine_tuned"] = b["fine_tuned"][chosen]["fine_tune"]
            b["chosen_on_dev"] = (
                chosen  # shape and share; the file's older runs are keyed by share alone
            )
            b["chosen_share_on_dev"] = b["fine_tuned"][chosen].get(
                "share", float(chosen.split("_")[-1])
            )
        b["f1_all"] = {
            name: {split: f1(r, split) for split in ("valid", "test")}
            for name, r in settings.items()
        }
        transfer = [name for name in ("joint", "fine_tuned") if name in settings]
        if "single" in settings and transfer:
            best = max(transfer, key=lambda name: b["f1_all"][name]["valid"])  # chosen on dev
            b["best_transfer_on_dev"] = best
            b["gain_over_single"] = {
                split: round(b["f1_all"][best][split] - b["f1_all"]["single"][split], 2)
                for split in ("valid", "test")
            }
            b["target_met"] = (
                b["gain_over_single"]["test"] >= 2 and b["gain_over_single"]["valid"] > 0
            )
            b["settings_compared"] = ["single", *transfer]  # a setting not yet run is missing here
        if (
            "shape" in settings
            and "fine_tuned" in settings
            and form(b["shape"]) == form(b["fine_tuned"][chosen])
        ):
            b["pretraining_gain"] = {
                split: round(b["f1_all"]["fine_tuned"][split] - b["f1_all"]["shape"][split], 2)
                for split in ("valid", "test")
            }
        save("b", b)

    if (
        "b" in args.parts and "joint" in args.settings and Path(f"{d}/parse_joint").is_dir()
    ):  # else the file's (c) is kept
        # the single-task curve: the pre-training run of (b), else the bilingual EN-DE run of (a)
        single_dir = pretrain if Path(pretrain).is_dir() else f"{d}/en_de"
        joint, single = dev_curve(f"{d}/parse_joint", "translate"), dev_curve(single_dir, None)
        rows = [
            {
                "member_updates": k,
                "joint_nll": round(v, 4),
                "single_nll": round(s, 4),
                "ratio": round(v / s, 4),
            }
            for k, v in joint
            if (s := at(single, k)) is not None
        ]
        save(
            "c",
            {
                "single_run": single_dir,
                "joint_curve": joint,
                "single_curve": single,
                "matched": rows,
                "target_met": bool(rows) and all(r["ratio"] <= 1.03 for r in rows),
            },
        )
    print(
        json.dumps(
            {
                "a: multilingual / bilingual BLEU": result.get("a", {}).get("ratio"),
                "b: F1 over all sentences": result.get("b", {}).get("f1_all"),
                "c: joint / single dev nll": [
                    r["ratio"] for r in result.get("c", {}).get("matched", [])
                ],
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
