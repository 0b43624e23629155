"""Learning from unlabelled text (issue 41): back-translation on Multi30k EN->DE, through the
commands a user runs (`s2s train`, `s2s label`, `s2s score`), at an equal number of updates.

    python bench/research/unlabelled.py --part a --updates 1000 --valid-interval 200   # about 60 minutes
    python bench/research/unlabelled.py --part b --updates 1819 --valid-interval 250   # about 40 minutes
    python bench/research/unlabelled.py --part a --updates 3000 --valid-interval 500 \
        --forward parallel_only bt_beam --suffix _3000 --name unlabelled_3000   # about 40 minutes
    python bench/research/unlabelled.py --part a --updates 6 --sentences 400 --name unlabelled_check \
        decode.beam=2 model.layers=1 model.d_model=32 model.d_ff=64     # the script, in a minute

(a) Low-resource back-translation: the first half of Multi30k's 29,000 training pairs is the
    parallel corpus, the German side of the second half the monolingual text. A reverse model
    (multi30k_en_de's task and model, DE->EN) trains on the parallel half; `s2s label` translates
    the monolingual German with it, once drawing each source (--sampling, Edunov et al. 2018) and
    once with its beam; EN->DE then trains on the parallel half alone, on parallel + sampled
    synthetic, on parallel + beam synthetic (the synthetic member tagged by its task token, the
    backtranslation preset's layout), and on all 29,000 real pairs (the upper bound). Every
    EN->DE run takes --updates updates with multi30k_en_de's settings and pre-norm layers (the
    multi-task runs need them: docs/multitask.md; the others have them too, so that only the
    data differs). Figures: test_2016_flickr sacreBLEU and dev BLEU of each run; the paired
    test (`s2s score --hyp A --hyp B`, approximate randomisation) of each against parallel-only;
    the labelling's time and counts. Target: back-translation >= parallel-only + 2.0 BLEU.
(b) Self-training on the treebank sample: ptb_sample_parsing trained --updates updates on the
    3,669 gold trees (1,819: the 10-minute update count of budget_ptb_tags_words.json); it parses
    the first --silver-sentences sentences of Multi30k's English side (image captions: another
    domain than the Wall Street Journal) with `s2s label --beam --keep`, and a second parser
    trains the same number of updates on gold + the kept silver trees (`task.silver_trees`);
    a third trains --pretrain-share of them on the silver trees alone, then the rest on gold
    from its weights (`run.init_from`).
    Figures: test and dev F1 over all sentences, repaired trees, the paired test of the two test
    outputs against the gold trees; the labelling's time apart. Target: gold + silver >= gold
    + 2.0 test F1, dev F1 moving the same way.

One run a setting; each step is skipped when its run (or labels) already finished, so the same
command resumes. Writes bench/research/results/NAME.json (default unlabelled) after every step. The data
files the runs read are written under --dir (the halves; dev and test are the shared copies).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import MULTI30K, write  # noqa: E402

S2S = [sys.executable, "-m", "s2s.core.apps.cli"]
SPLITS = {"val": "val", "test_2016_flickr": "test_2016_flickr"}


def s2s(*args: str, log: Path) -> float:
    """Run `s2s ARGS`, its output appended to `log`; the seconds it took. Fails loudly."""
    t0 = time.monotonic()
    with open(log, "a", encoding="utf-8") as f:
        f.write(f"\n$ s2s {' '.join(args)}\n")
        f.flush()
        done = subprocess.run([*S2S, *args], stdout=f, stderr=subprocess.STDOUT)
    if done.returncode:
        sys.exit(f"s2s {args[0]} failed ({done.returncode}): see {log}")
    return round(time.monotonic() - t0, 1)


def _write(path: Path, text: str) -> None:
    """`text` into `path` unless it holds it already: a file rewritten unchanged would still
    count as changed for the prepared-data cache, which then rebuilds its vocabulary."""
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")


def halves(directory: Path, sentences: int) -> tuple[Path, Path, Path]:
    """(parallel folder, monolingual German file, full folder): the first `sentences` // 2
    training pairs, the German of the next as many, and all `sentences` pairs; dev and test are
    links to the shared files."""
    en = (MULTI30K / "train.en").read_text(encoding="utf-8").splitlines()[:sentences]
    de = (MULTI30K / "train.de").read_text(encoding="utf-8").splitlines()[:sentences]
    half = len(en) // 2
    parallel, full = directory / "parallel", directory / "full"
    for folder, rows in ((parallel, slice(0, half)), (full, slice(0, len(en)))):
        folder.mkdir(parents=True, exist_ok=True)
        for lang, lines in (("en", en), ("de", de)):
            _write(folder / f"train.{lang}", "\n".join(lines[rows]) + "\n")
            for split in SPLITS:
                link = folder / f"{split}.{lang}"
                if not link.exists():
                    link.symlink_to(MULTI30K / f"{split}.{lang}")
    mono = directory / "mono.de"
    _write(mono, "\n".join(de[half:]) + "\n")
    return parallel, mono, full


def common(args) -> list[str]:
    return [
        f"optim.max_updates={args.updates}",
        "run.max_minutes=0",
        f"run.valid_interval={args.valid_interval}",
        f"data.cache_dir={args.dir / 'cache'}",
        "run.quiet=true",
        *args.overrides,
    ]


def backtranslation_preset(path: Path, parallel: Path, labels: Path) -> Path:
    """The backtranslation preset's layout on multi30k_en_de's task and model settings."""
    import yaml

    member = {"preset": "multi30k_en_de", "task": {"source": "text", "data_dir": str(parallel)}}
    synthetic = {
        "preset": "multi30k_en_de",
        "task": {
            "source": "text",
            "data_dir": str(labels),
            "train_prefix": "synthetic",
            "valid_prefix": "",
            "test_prefix": "",
        },
        "select": 0,
    }
    from s2s.core.setup.config import load_config
    from s2s.core.setup.registry import Registry

    base = load_config("multi30k_en_de", registry=Registry.installed())
    from omegaconf import OmegaConf

    sections = {
        k: OmegaConf.to_container(base[k], enum_to_str=True)
        for k in ("model", "optim", "data", "run")
    }
    preset = {
        "tasks": {"parallel": member, "synthetic": synthetic},
        "multitask": {"temperature": 1.0, "shared_vocab": True},
        **sections,
    }
    path.write_text(yaml.safe_dump(preset, sort_keys=False), encoding="utf-8")
    return path


def test_figures(run: Path) -> dict:
    """A finished run's update, test figures (the parallel member's in a back-translation
    run), the primary figure's interval and the dev figures of the candidates it chose from."""
    result = json.loads((run / "result.json").read_text())
    test = result["test"]
    test = test.get("parallel", test) if "signature" not in test else test
    return {
        "update": result["update"],
        "test": {k: v for k, v in test.items() if isinstance(v, (int, float))},
        "test_intervals": test.get("intervals"),
        "dev_select": result.get("dev_select"),
    }


def curves(args, runs: dict, key: str, title: str, name: str) -> str:
    """Dev `key` per update of each run (label -> run folder, or (folder, updates before it): a
    fine-tuning run's start) drawn into docs/figures/NAME.png; the figure's path, relative to the
    repository."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from s2s.core.runs.metrics import read_metrics

    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    for label, folder in runs.items():
        folder, before = folder if isinstance(folder, tuple) else (folder, 0)
        rows = [r for r in read_metrics(args.dir / folder) if r.get("kind") == "valid"]
        points = [  # a multi-task run's figure of its member: "parallel/bleu"
            (
                before + r["update"],
                r.get(key, next((v for k, v in r.items() if k.endswith("/" + key)), None)),
            )
            for r in rows
        ]
        points = [(u, v) for u, v in points if v is not None]
        ax.plot(*zip(*points), marker="o", label=label)
    ax.set_xlabel("update")
    ax.set_ylabel(f"dev {key}")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    figures = Path(__file__).resolve().parents[2] / "docs" / "figures"
    fig.tight_layout()
    fig.savefig(figures / f"{name}.png")
    plt.close(fig)
    return f"docs/figures/{name}.png"


def part_a(args, out: dict, trained, log: Path) -> None:
    """Back-translation: the reverse model, its labels, the EN->DE runs (module doc)."""
    parallel, mono, full = halves(args.dir / "data", args.sentences)
    out["parts"]["a"]["parallel_pairs"] = sum(1 for _ in open(parallel / "train.en"))
    out["parts"]["a"]["monolingual_sentences"] = sum(1 for _ in open(mono))
    forward = [*common(args), "model.pre_norm=true"]

    text = ["task.source=text", f"task.data_dir={parallel}"]
    reverse = trained(
        "reverse_de_en",
        "multi30k_en_de",
        *text,
        "task.src_lang=de",
        "task.tgt_lang=en",
        *common(args),
    )
    for way, options in (("sampling", ["--sampling", "--seed", "1"]), ("beam", [])):
        labels = args.dir / f"labels_{way}"
        if not (labels / "summary.json").is_file():
            seconds = s2s(
                "label",
                str(reverse),
                "--input",
                str(mono),
                "--output",
                str(labels),
                *options,
                log=log,
            )
            summary = json.loads((labels / "summary.json").read_text())
            out["labels"][way] = {**summary, "seconds": seconds}
            write(args.name, out)
    sx = args.suffix  # the EN->DE runs' folders: NAME + suffix (another budget beside these)
    presets = {
        "parallel_only": ["multi30k_en_de", *text],
        "full": ["multi30k_en_de", "task.source=text", f"task.data_dir={full}"],
    }
    for way in ("sampling", "beam"):
        path = args.dir / f"backtranslation_{way}.yaml"
        presets[f"bt_{way}"] = [
            str(backtranslation_preset(path, parallel, args.dir / f"labels_{way}"))
        ]
    wanted = {"parallel_only", *args.forward}
    runs = {n: trained(n + sx, *presets[n], *forward) for n in presets if n in wanted}
    baseline = runs["parallel_only"]
    refs = MULTI30K / "test_2016_flickr.de"
    for name, run in runs.items():
        if name == "parallel_only" or "paired" in out["runs"][name + sx]:
            continue
        hyp = run / ("test.parallel.hyp.txt" if name.startswith("bt_") else "test.hyp.txt")
        score = [*S2S, "score", "multi30k_en_de", "--ref", str(refs), "--json"]
        both = ["--hyp", str(baseline / "test.hyp.txt"), "--hyp", str(hyp)]
        done = subprocess.run([*score, *both], capture_output=True, text=True, check=True)
        out["runs"][name + sx]["paired"] = json.loads(done.stdout)
        write(args.name, out)
    labels = {
        "parallel_only": "parallel half only",
        "bt_sampling": "+ sampled back-translation",
        "bt_beam": "+ beam back-translation",
        "full": "all 29,000 real pairs",
    }
    out["parts"]["a"]["curves"] = curves(
        args,
        {labels[n]: n + sx for n in runs},
        "bleu",
        f"Multi30k EN->DE, dev BLEU (the parallel member's), {args.updates} updates",
        f"{args.name}_backtranslation",
    )


def part_b(args, out: dict, trained, log: Path) -> None:
    """Self-training: gold only, the silver treebank it labels, gold + silver (module doc)."""
    from bench.common import corpus_overrides
    from s2s.core.setup.config import load_config
    from s2s.core.setup.registry import Registry

    parse = [*corpus_overrides("ptb_sample_parsing"), *common(args)]
    gold = trained("parse_gold", "ptb_sample_parsing", *parse)
    raw = args.dir / "data" / "captions.en"
    raw.parent.mkdir(parents=True, exist_ok=True)
    english = (MULTI30K / "train.en").read_text(encoding="utf-8").splitlines()
    _write(raw, "\n".join(english[: args.silver_sentences]) + "\n")
    labels = args.dir / "labels_parse"
    if not (labels / "summary.json").is_file():
        seconds = s2s(
            "label", str(gold), "--input", str(raw), "--output", str(labels), "--beam",
            str(args.silver_beam), "--keep", str(args.keep), log=log,
        )  # fmt: skip
        out["labels"]["parse"] = {
            **json.loads((labels / "summary.json").read_text()),
            "seconds": seconds,
        }
    silver = trained(
        "parse_gold_silver", "ptb_sample_parsing", *parse,
        f"task.silver_trees={labels / 'synthetic.trees'}",
    )  # fmt: skip
    cfg = load_config("ptb_sample_parsing", parse, registry=Registry.installed())
    task = Registry.installed().get("parsing")(cfg.task)
    gold_files = {}
    for split in ("valid", "test"):
        gold_files[split] = args.dir / "data" / f"ptb_{split}.trees"
        text = "".join(t + "\n" for t in task.references(split))
        _write(gold_files[split], text)
    first = round(args.updates * args.pretrain_share)  # silver alone, then gold from it
    pretrained = trained(
        "parse_silver", "ptb_sample_parsing", *parse, "task.corpus=lines",
        f"task.train_file={labels / 'synthetic.trees'}", f"task.valid_file={gold_files['valid']}",
        f"task.test_file={gold_files['test']}", f"optim.max_updates={first}",
    )  # fmt: skip
    fine_tuned = trained(
        "parse_silver_then_gold", "ptb_sample_parsing", *parse, f"run.init_from={pretrained}",
        f"optim.max_updates={args.updates - first}",
    )  # fmt: skip
    out["parts"]["b"]["pretrain_updates"] = first
    for name, run in (("parse_gold_silver", silver), ("parse_silver_then_gold", fine_tuned)):
        if "paired" in out["runs"][name]:
            continue
        score = [*S2S, "score", "ptb_sample_parsing", *parse[:1], "--json"]
        both = ["--hyp", str(gold / "test.hyp.txt"), "--hyp", str(run / "test.hyp.txt")]
        refs = ["--ref", str(gold_files["test"])]
        done = subprocess.run([*score, *refs, *both], capture_output=True, text=True, check=True)
        out["runs"][name]["paired"] = json.loads(done.stdout)
    out["parts"]["b"]["curves"] = curves(
        args,
        {
            "gold only": "parse_gold",
            "gold + silver": "parse_gold_silver",
            "silver, then gold": ("parse_silver_then_gold", first),
        },
        "f1_all",
        "Treebank sample, dev F1 over all sentences (64 sentences, beam 4)",
        f"{args.name}_selftraining",
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--updates", type=int, default=1000, help="updates of every training run")
    p.add_argument("--sentences", type=int, default=29000, help="training pairs used in all")
    p.add_argument("--valid-interval", type=int, default=500)
    p.add_argument("--dir", type=Path, default=Path("runs/unlabelled"))
    p.add_argument("--name", default="unlabelled")
    p.add_argument("--part", choices=("a", "b"), default="a")
    p.add_argument(
        "--forward",
        nargs="+",
        default=["parallel_only", "bt_sampling", "bt_beam", "full"],
        help="(a) the EN->DE runs to train (parallel_only always)",
    )
    p.add_argument("--suffix", default="", help="(a) added to the EN->DE runs' folder names")
    p.add_argument("--silver-sentences", type=int, default=10000, help="(b) captions parsed")
    p.add_argument("--silver-beam", type=int, default=4, help="(b) the labelling's beam")
    p.add_argument("--keep", type=float, default=0.3, help="(b) the silver trees kept")
    p.add_argument(
        "--pretrain-share", type=float, default=1 / 3, help="(b) updates on silver alone, first"
    )
    p.add_argument("overrides", nargs="*", help="key=value for every run, e.g. decode.beam=2")
    args = p.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    log = args.dir / "bench.log"
    out = {
        "command": "python bench/research/unlabelled.py " + " ".join(sys.argv[1:]),
        "note": "one run a setting; (a)'s EN->DE runs multi30k_en_de with model.pre_norm=true",
        "runs": {},
        "labels": {},
    }
    results = Path(__file__).resolve().parent / "results" / f"{args.name}.json"
    if results.is_file():
        had = json.loads(results.read_text())
        out["runs"], out["labels"] = had.get("runs", {}), had.get("labels", {})
        out["parts"] = had.get("parts", {})
    out.setdefault("parts", {})[args.part] = {
        "command": out.pop("command"),
        "updates": args.updates,
    }

    def trained(name: str, *argv: str) -> Path:
        run = args.dir / name
        if not (run / "result.json").is_file():
            seconds = s2s("train", *argv, f"run.dir={run}", log=log)
            out["runs"][name] = {**test_figures(run), "seconds": seconds}
            write(args.name, out)
        return run

    (part_a if args.part == "a" else part_b)(args, out, trained, log)
    write(args.name, out)


if __name__ == "__main__":
    main()
