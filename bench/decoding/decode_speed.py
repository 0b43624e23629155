"""Decoding speed: sentences/s of beam search and greedy search (issue 6, benchmark b).

    python -m bench.decoding.decode_speed --run runs/multi30k_en_de --parsing-run runs/ptb_sample_parsing
    python -m bench.decoding.decode_speed                 # untrained models of the presets' sizes (fewer
                                                 # parsing sentences then: they run to max length)
    python -m bench.decoding.decode_speed --run runs/multi30k_en_de --skip parsing full --name decode_speed_ctranslate2
                                                 # translation and s2s against CTranslate2 only (~3 min)
    python -m bench.decoding.decode_speed --baseline 838d1f7 --run runs/m30k --parsing-run runs/ptb10 \
        --skip translation parsing --name decode_speed_vs_838d1f7   # s2s generate, this tree against a commit

Translation: the multi30k_en_de model (a trained run directory with --run, else a randomly
initialised model of the preset's size) on the first 1,000 lines of test_2016_flickr.en, with
the task's defaults (beam 4, alpha 0.6, at most source + 50 tokens, the exact stopping bound),
the same with fairseq's stopping rule (decode.stop=beam) and greedy search; the test BLEU of
each says what the faster ones cost. Then beam search in each `--precisions` setting (the model
`s2s generate` searches with for decode.precision=bf16 / int8, s2s.core.nn.precision.for_inference)
with both stopping rules, interleaved with fp32 repeat by repeat: sentences/s, the speed ratio to
fp32 with the same rule, test BLEU and its difference from fp32's.
Parsing: the ptb_sample_parsing model (--parsing-run, else random) at beam 21, alpha 0.3, at
most source + 300 tokens (both stopping rules), on sentences of the NLTK treebank sample (dev, test, then training
sentences, up to --parsing-sentences). Speed follows output length, and an untrained model's
lengths say nothing of a trained one's: over translation's 8,000 tokens it almost never ends a
hypothesis (every search runs to the maximum length), over parsing's 59 it ends at once. The
JSON says which kind of model was measured and gives mean output and reference lengths. It
also times beam 21 with the tree constraint on and off on the same model
(`constrained_vs_unconstrained`; target: constrained >= 0.8x the unconstrained rate).

Rates are those of `s2s generate`'s path (s2s.core.decode.batched.Decoder.generate: sentences sorted by
length, `--max-sentences` at a time, on CPU `--threads` batches at once, one thread each); the
clock covers tokenising, search and turning ids back into text; medians of `--repeats` runs,
the variants interleaved. Full recompute (the decoder re-run over the whole prefix at every step) is quadratic in the
output length, so it is timed on a subset (every k-th sentence of the sorted list), batch for
batch interleaved with incremental decoding of the same subset, both through `generate` with
`--threads` intra-op threads; the JSON gives the subset, the
ratio measured on it, and full recompute's rate on the whole set extrapolated from that ratio.

CTranslate2 (when installed; `--skip ctranslate2` leaves it out): the same translation model
exported by `s2s export --to ctranslate2` in fp32 and int8, greedy and at the task's beam, on the
same sentences, each run interleaved with s2s's own greedy and beam runs; the clock covers the
same steps (tokenise, search, ids to text), with a Translator of one replica on `--threads`
intra-op threads. Greedy fp32 gives s2s's tokens exactly (the JSON counts the sentences whose
output differs); beam search scores with CTranslate2's own length penalty and stopping rule.
The JSON gives each variant's rate, its speed-up over s2s at the same search, and its test BLEU.

Against a commit (`--baseline REV`): `s2s generate` end to end (a process each: start, load,
tokenise, search, write), this tree's against the same command run from a git worktree of REV,
interleaved, on the parsing test split (beam 21, the tree constraint: EVALB F1 against the gold
trees) and the translation sentences (beam 4: sacreBLEU), in each `--baseline-precisions`
(decode.precision); the JSON gives sentences/s, the speed ratio to REV's fp32 and the score.
"""

from __future__ import annotations

import s2s.core  # noqa: E402,F401  before torch: the CPU runtime defaults (s2s.core.RUNTIME_ENV)

import argparse
import importlib.util
import statistics
import threading
import time
from dataclasses import replace
from itertools import islice
from pathlib import Path

import torch

from bench.common import (
    MULTI30K,
    REPO,
    commit_tree,
    corpus_overrides,
    machine,
    mm_rate,
    peak_rss_mib,
    runtime_env,
    s2s_command,
    table,
    write,
)


def load(preset: str, run: str | None, cache_dir: str):
    """(task, model, decoding settings, description) for a run directory or an untrained model."""
    from s2s.core.data.idspace import join
    from s2s.core.data.members import Member, build_task, decode_settings
    from s2s.core.data.nodes import prepare_data
    from s2s.core.inference import load_for_inference
    from s2s.core.nn.model import Transformer
    from s2s.core.setup.config import load_config
    from s2s.core.setup.registry import Registry
    from s2s.core.runs import checkpoint
    from s2s.core.runs.directory import run_dir_of
    from s2s.core.runs.metrics import read_metrics

    registry = Registry.installed()
    if run:
        cfg, member, model = load_for_inference(
            run, registry, ["run.device=cpu", "decode.precision=fp32"]
        )
        task, path, run_dir = member.task, Path(run), run_dir_of(run)
        desc = {"model": "trained", "run": str(run)}
        if path.is_file():
            desc["checkpoint"] = path.name
        else:
            desc["checkpoint"] = str(checkpoint.tested(path)[1].relative_to(path))
        if (run_dir / "metrics.jsonl").is_file():
            records = read_metrics(run_dir)
            train = [r for r in records if r.get("kind") == "train"]
            if train:
                desc.update(
                    updates_logged=train[-1]["update"], train_nll=round(train[-1]["nll"], 3)
                )
            valid = [r for r in records if r.get("kind") in ("valid", "test")]
            if valid:
                desc["last_evaluation"] = {k: v for k, v in valid[-1].items() if k != "elapsed"}
    else:
        cfg = load_config(
            preset, [*corpus_overrides(preset), f"data.cache_dir={cache_dir}"], registry=registry
        )
        task = build_task(cfg.task, registry)
        prepare_data(task, cfg.data, quiet=True)  # the tokenizer (cached)
        torch.manual_seed(cfg.run.seed)
        model = Transformer(cfg.model, *join([Member(task.name, task)])).eval()
        desc = {"model": "untrained (random initialisation): hypotheses run to the maximum length"}
    desc.update(
        preset=preset,
        parameters=model.num_parameters(),
        layers=cfg.model.layers,
        d_model=cfg.model.d_model,
        src_vocab=task.src_vocab_size,
        tgt_vocab=task.tgt_vocab_size,
    )
    return task, model, decode_settings(task, cfg.decode), desc


def batches_of(
    task, sources: list[str], max_sentences: int
) -> list[tuple[list[int], torch.Tensor]]:
    """(sentence numbers, padded source ids + EOS) per batch, sorted by length as `generate` does."""
    from s2s.core.data.batches import chunks
    from s2s.core.decode.batched import source_batch

    ids = task.encode_source(sources)
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    return [
        (batch, source_batch([ids[i] for i in batch])) for batch in chunks(order, max_sentences)
    ]


def decode_batch(model, task, sources, batch, settings, incremental: bool) -> float:
    """Seconds to search one batch (with the settings' beam; 1 is greedy) and turn its
    hypotheses into text."""
    from s2s.core.decode.search import search

    rows, src = batch
    t0 = time.perf_counter()
    hyps = search(model, src, settings, incremental=incremental)
    for i, h in zip(rows, hyps):
        task.postprocess(task.decode_target(h.tokens), sources[i])
    return time.perf_counter() - t0


def rates(model, task, sources, variants: dict, repeats: int, max_sentences: int) -> dict:
    """For each variant (name -> decoding settings): sentences/s of `generate` (what `s2s
    generate` runs: tokenise, search batches of similar length, ids to text) over all sources,
    the median of `repeats` runs, variants interleaved so that a change in the machine's load
    touches them alike. Also the rate had the process had its threads' cores to itself
    (sentences per CPU-second times threads), which a shared machine's load disturbs less."""
    from s2s.core.decode.batched import Decoder

    runs = {name: [] for name in variants}
    outputs, rows = {}, {}
    counter, lock = [0], threading.Lock()
    step = model.decode_step

    def counted(tokens, cache):  # decoder rows evaluated (hypotheses x steps), for the FLOP count
        with lock:
            counter[0] += tokens.size(0)
        return step(tokens, cache)

    model.decode_step = counted
    try:
        for _ in range(repeats):
            for name, settings in variants.items():
                counter[0] = 0
                t0, c0 = time.perf_counter(), time.process_time()
                outputs[name] = Decoder(model, task, settings, "cpu", max_sentences).generate(
                    sources
                )
                runs[name].append((time.perf_counter() - t0, time.process_time() - c0))
                rows[name] = counter[0]
    finally:
        del model.decode_step
    src_tokens = sum(len(ids) + 1 for ids in task.encode_source(sources))
    result = {}
    for name, settings in variants.items():
        wall = statistics.median(w for w, _ in runs[name])
        cpu = statistics.median(c for _, c in runs[name])
        result[name] = {
            "settings": vars(settings),
            "sentences": len(sources),
            "repeats": repeats,
            "seconds_median": round(wall, 2),
            "seconds_all": [round(w, 2) for w, _ in runs[name]],
            "sentences_per_s": round(len(sources) / wall, 2),
            "cpu_seconds_median": round(cpu, 2),
            "sentences_per_s_own_cores": round(len(sources) * torch.get_num_threads() / cpu, 2),
            "mean_output_tokens": round(
                sum(map(len, task.encode_target(outputs[name]))) / len(sources), 2
            ),
            "decoder_rows_per_sentence": round(rows[name] / len(sources), 2),
        }
        # matmul FLOPs of the search: per source token and per decoder row, attention left out
        gflop = (
            model.flops(src_tokens, rows[name], backward=False, attention=False)
            / len(sources)
            / 1e9
        )
        result[name].update(
            gflop_per_sentence=round(gflop, 4),
            model_gflops_per_s=round(gflop * len(sources) / wall, 1),
        )
    return result, outputs


def constraint_speed(model, task, sources, settings, repeats: int, max_sentences: int) -> dict:
    """Parsing: sentences/s of `generate` with the tree constraint on and off (task setting
    `constrained`), same model and settings, interleaved, medians of `repeats` runs; with the
    repairs the unconstrained outputs needed (the constrained ones need none by construction)."""
    from s2s.core.decode.batched import Decoder

    runs, repaired, was = {True: [], False: []}, {}, task.cfg.constrained
    try:
        for _ in range(repeats):
            for on in (True, False):
                task.cfg.constrained = on
                t0 = time.perf_counter()  # search, ids to text, trees: what translate does
                hyps = Decoder(model, task, settings, "cpu", max_sentences).generate(
                    sources, postprocess=False
                )
                repaired[on] = task.rebuild(hyps, sources)[1]
                runs[on].append(time.perf_counter() - t0)
    finally:
        task.cfg.constrained = was
    rate = {on: len(sources) / statistics.median(r) for on, r in runs.items()}
    return {
        "beam": settings.beam,
        "sentences": len(sources),
        "repeats": repeats,
        "constrained_sentences_per_s": round(rate[True], 2),
        "unconstrained_sentences_per_s": round(rate[False], 2),
        "ratio": round(rate[True] / rate[False], 3),
        "target_ratio": 0.8,
        "repaired_constrained": repaired[True],
        "repaired_unconstrained": repaired[False],
    }


def versus_full(
    model, task, sources, settings, subset: int, max_sentences: int, repeats: int
) -> dict:
    """Incremental against full recompute on every k-th sentence (by length), batch by batch,
    through `generate` with the process's threads; the median ratio of `repeats` rounds."""
    ids = task.encode_source(sources)
    by_len = sorted(range(len(sources)), key=lambda i: len(ids[i]))
    k = max(1, len(sources) // subset)
    chosen = [sources[i] for i in by_len[::k][:subset]]
    batches = batches_of(task, chosen, max_sentences)
    runs = []
    for _ in range(repeats):
        inc = full = 0.0
        for b in batches:
            full += decode_batch(model, task, chosen, b, settings, incremental=False)
            inc += decode_batch(model, task, chosen, b, settings, incremental=True)
        runs.append((inc, full))
    inc, full = (statistics.median(r[i] for r in runs) for i in (0, 1))
    return {
        "subset_sentences": len(chosen),
        "subset_every_kth_by_length": k,
        "repeats": repeats,
        "incremental_s_median": round(inc, 2),
        "full_recompute_s_median": round(full, 2),
        "speedup": round(statistics.median(f / i for i, f in runs), 2),
        "speedups_all": [round(f / i, 2) for i, f in runs],
        "full_recompute_sentences_per_s_subset": round(len(chosen) / full, 3),
    }


def versus_ctranslate2(
    model,
    task,
    sources,
    refs,
    settings,
    threads: int,
    repeats: int,
    max_sentences: int,
    precisions=(),
) -> dict:
    """s2s (fp32 and each of `precisions`) against its CTranslate2 export (fp32, int8), greedy and
    at the task's beam: sentences/s (medians of `repeats` rounds, the variants interleaved within
    each round) and test BLEU. At the beam, s2s runs with the task's stopping rule and with
    decode.stop=beam (`_stop_beam`), CTranslate2's own: it stops a sentence once beam_size
    hypotheses have finished (its patience 1); each CTranslate2 row names the fastest s2s search
    under either rule (`best_s2s`, `best_s2s_same_rule`)."""
    from s2s.core.decode.batched import Decoder
    import tempfile

    import ctranslate2
    from s2s.core.inference.deployed import decode_ctranslate2
    from s2s.core.inference.formats.ctranslate2 import to_ctranslate2
    from s2s.core.nn.precision import for_inference, resolve

    greedy = replace(settings, beam=1)
    searched = {
        p: for_inference(model, resolve(p, torch.device("cpu"), "--precisions")) for p in precisions
    }
    with tempfile.TemporaryDirectory(prefix="s2s-ct2-") as tmp:
        translators = {}
        for q in ("float32", "int8"):
            to_ctranslate2(model, task, Path(tmp) / q, quantization=None if q == "float32" else q)
            translators[q] = ctranslate2.Translator(
                str(Path(tmp) / q), device="cpu", inter_threads=1, intra_threads=threads
            )

        def ct2(q, s):
            ids = decode_ctranslate2(
                translators[q], Decoder(model, task, s, "cpu", max_sentences), sources
            )
            return [task.postprocess(task.decode_target(h), src) for h, src in zip(ids, sources)]

        variants = {}
        searches = [(f"beam{settings.beam}", settings), ("greedy", greedy)]
        if settings.stop != "beam":
            searches.insert(1, (f"beam{settings.beam}_stop_beam", replace(settings, stop="beam")))
        for name, s in searches:
            variants[f"s2s_{name}"] = lambda s=s: Decoder(
                model, task, s, "cpu", max_sentences
            ).generate(sources)
            for p, m in searched.items():  # s2s's other precisions, as decode.precision loads them
                variants[f"s2s_{p}_{name}"] = lambda s=s, m=m: Decoder(
                    m, task, s, "cpu", max_sentences
                ).generate(sources)
            if not name.endswith("_stop_beam"):  # CTranslate2 has its own rule
                for q in translators:
                    variants[f"ct2_{q}_{name}"] = lambda q=q, s=s: ct2(q, s)
        runs = {name: [] for name in variants}
        outputs = {}
        for _ in range(repeats):
            for name, run in variants.items():
                t0 = time.perf_counter()
                outputs[name] = run()
                runs[name].append(time.perf_counter() - t0)
    result = {
        "translator": f"ctranslate2 {ctranslate2.__version__}, cpu, inter_threads 1, intra_threads {threads}",
        "sentences": len(sources),
        "repeats": repeats,
    }
    for name in variants:
        wall = statistics.median(runs[name])
        result[name] = {
            "seconds_median": round(wall, 2),
            "seconds_all": [round(w, 2) for w in runs[name]],
            "sentences_per_s": round(len(sources) / wall, 2),
            "test_bleu": round(task.score(outputs[name], refs).value, 2),
        }
    for name in variants:
        if name.startswith("ct2_"):
            ours = f"s2s_{name.split('_', 2)[2]}"
            best = max(
                (r for r in result if r.startswith("s2s_") and r.endswith(name.split("_", 2)[2])),
                key=lambda r: result[r]["sentences_per_s"],
            )
            result[name]["best_s2s"] = best
            result[name]["best_s2s_vs_this"] = round(
                result[best]["sentences_per_s"] / result[name]["sentences_per_s"], 3
            )
            if name.endswith(f"_beam{settings.beam}") and settings.stop != "beam":
                same = max(
                    (r for r in result if r.startswith("s2s_") and r.endswith("_stop_beam")),
                    key=lambda r: result[r]["sentences_per_s"],
                )
                result[name]["best_s2s_same_rule"] = same
                result[name]["best_s2s_same_rule_vs_this"] = round(
                    result[same]["sentences_per_s"] / result[name]["sentences_per_s"], 3
                )
            result[name]["speedup_vs_s2s"] = round(
                result[name]["sentences_per_s"] / result[ours]["sentences_per_s"], 2
            )
            result[name]["sentences_differing_from_s2s"] = sum(
                a != b for a, b in zip(outputs[name], outputs[ours])
            )
    return result


def precision_rates(
    model, task, sources, refs, settings, precisions: list[str], repeats: int, max_sentences: int
) -> dict:
    """Search in each precision (s2s.core.nn.precision.for_inference: the model `s2s generate` loads
    with decode.precision) with both stopping rules, sentences/s and test BLEU, each against fp32:
    every repeat runs all of them in turn, so that fp32 is measured next to the others."""
    from s2s.core.decode.batched import Decoder
    from s2s.core.nn.precision import for_inference, resolve

    chosen = {p: resolve(p, torch.device("cpu"), "--precisions") for p in ["fp32", *precisions]}
    models = {p: for_inference(model, chosen[p]) for p in dict.fromkeys(["fp32", *precisions])}
    variants = {
        f"{p}_{stop}": (p, replace(settings, stop=stop))
        for p in models
        for stop in ("bound", "beam")
    }
    seconds, outputs = {name: [] for name in variants}, {}
    for _ in range(repeats):
        for name, (p, s) in variants.items():
            t0 = time.perf_counter()
            outputs[name] = Decoder(models[p], task, s, "cpu", max_sentences).generate(sources)
            seconds[name].append(time.perf_counter() - t0)
    result = {}
    for name, (p, s) in variants.items():
        wall = statistics.median(seconds[name])
        result[name] = {
            "precision": p,
            "computed_in": chosen[p],
            "stop": str(s.stop),
            "sentences": len(sources),
            "seconds_all": [round(x, 2) for x in seconds[name]],
            "sentences_per_s": round(len(sources) / wall, 2),
            "test_score": round(task.score(outputs[name], refs).value, 2),
            "same_lines_as_fp32": round(
                sum(a == b for a, b in zip(outputs[name], outputs[f"fp32_{s.stop}"]))
                / len(sources),
                4,
            ),
        }
    for (
        name,
        r,
    ) in result.items():  # per-repeat speed ratios against fp32 with the same stopping rule
        ref = seconds[f"fp32_{r['stop']}"]
        r["speed_vs_fp32_median"] = round(
            statistics.median(a / b for a, b in zip(ref, seconds[name])), 3
        )
        r["test_score_vs_fp32"] = round(
            r["test_score"] - result[f"fp32_{r['stop']}"]["test_score"], 2
        )
    return result


def versus_baseline(
    rev: str, jobs: dict, threads: int, repeats: int, precisions: list[str]
) -> dict:
    """`s2s generate RUN_DIR` of this tree against commit `rev`'s, interleaved, medians of
    `repeats`; jobs: name -> (run directory, source lines, score function of the output lines,
    overrides for this tree only: settings the commit does not know)."""
    import subprocess
    import tempfile

    result = {
        "baseline": rev,
        "threads": threads,
        "repeats": repeats,
        "clock": "s2s generate end to end, one process per run (start, load, search, write)",
    }
    with commit_tree(rev) as base, tempfile.TemporaryDirectory(prefix="s2s-base-") as tmp:
        trees = {"this": None, rev: base}
        for name, (run_dir, sources, score, own) in jobs.items():
            src = Path(tmp) / f"{name}.txt"
            src.write_text("\n".join(sources) + "\n", encoding="utf-8")
            variants = {(code, p): path for code, path in trees.items() for p in precisions}
            seconds, outputs = {v: [] for v in variants}, {}
            for r in range(repeats):  # ABBA: the load's drift over a round touches both trees alike
                for (code, p), path in (list if r % 2 == 0 else reversed)(list(variants.items())):
                    cmd = [
                        *s2s_command(path),
                        "generate",
                        "-q",
                        run_dir,
                        f"decode.precision={p}",
                        "run.device=cpu",
                        f"run.threads={threads}",
                        *(own if path is None or knows(rev, own) else []),
                    ]
                    t0 = time.perf_counter()
                    out = subprocess.run(
                        cmd, stdin=src.open("rb"), capture_output=True, text=True, check=True
                    )
                    seconds[(code, p)].append(time.perf_counter() - t0)
                    outputs[(code, p)] = out.stdout.splitlines()
            rows = result[name] = {"run": run_dir, "sentences": len(sources)}
            ref = (
                seconds[(rev, "fp32")] if (rev, "fp32") in seconds else seconds[next(iter(seconds))]
            )
            for (code, p), secs in seconds.items():
                rows[f"{'this' if code == 'this' else 'baseline'}_{p}"] = {
                    "sentences_per_s": round(len(sources) / statistics.median(secs), 2),
                    "seconds_all": [round(x, 2) for x in secs],
                    "speed_vs_baseline_fp32_median": round(
                        statistics.median(a / b for a, b in zip(ref, secs)), 3
                    ),
                    "score": round(score(outputs[(code, p)]), 2),
                }
    return result


def knows(rev: str, overrides: list[str]) -> bool:
    """Whether commit `rev`'s parsing task has the settings `overrides` set (task.tokenize came
    after 838d1f7): a baseline that has them gets them too, so both trees read the same input."""
    import subprocess

    keys = [o.split("=")[0].removeprefix("task.") for o in overrides]
    shown = subprocess.run(
        ["git", "show", f"{rev}:plugins/parsing/__init__.py"], cwd=REPO, capture_output=True
    ).stdout.decode("utf-8", "replace")
    return all(f"    {key}:" in shown for key in keys)


def parsing_job(run: str) -> tuple:
    """The parsing test split of run's preset: (run, sources, EVALB F1 of output trees)."""
    from s2s.core.data.members import data_config
    from s2s.core.data.nodes import prepare_data
    from s2s.core.inference import load_for_inference
    from s2s.core.setup.registry import Registry
    from s2s.plugins.parsing.evalb import evalb

    cfg, member, _ = load_for_inference(run, Registry.installed(), ["run.device=cpu"])
    sources, _ = prepare_data(member.task, data_config(cfg), quiet=True).texts("test")
    gold = list(member.task.references("test"))
    # the test split is tokenised already: this tree's raw-text tokenisation stays off, as in REV
    own = ["task.tokenize=false"] if "tokenize" in member.task.cfg else []
    return run, sources, lambda trees: evalb(gold, trees).summary["f1"], own


def translation_job(run: str, n: int) -> tuple:
    """Multi30k's test_2016_flickr (first n lines): (run, sources, sacreBLEU of output lines)."""
    from s2s.core.inference import load_for_inference
    from s2s.core.setup.registry import Registry

    _, member, _ = load_for_inference(run, Registry.installed(), ["run.device=cpu"])
    path = MULTI30K / "test_2016_flickr.en"
    sources = path.read_text(encoding="utf-8").splitlines()[:n]
    refs = path.with_suffix(".de").read_text(encoding="utf-8").splitlines()[:n]
    return run, sources, lambda lines: member.task.score(lines, refs).value, []


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--run", help="a trained multi30k_en_de run directory (else an untrained model)"
    )
    ap.add_argument(
        "--parsing-run", help="a trained ptb_sample_parsing run directory (else untrained)"
    )
    ap.add_argument("--sentences", type=int, default=1000)
    ap.add_argument(
        "--parsing-sentences", type=int, help="default 1000, 128 for an untrained model"
    )
    ap.add_argument(
        "--full-sentences",
        type=int,
        help="subset decoded with full recompute, beam 4: default 128, 16 for an untrained model",
    )
    ap.add_argument(
        "--parsing-full-sentences", type=int, help="the same, beam 21: default 16, 2 untrained"
    )
    ap.add_argument("--max-sentences", type=int, default=128, help="sentences decoded together")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--repeats", type=int, default=3, help="runs of each measurement; medians are reported"
    )
    ap.add_argument(
        "--skip",
        nargs="*",
        default=[],
        choices=["translation", "parsing", "full", "ctranslate2", "precision"],
    )
    ap.add_argument(
        "--precisions",
        nargs="*",
        default=["bf16", "int8"],
        choices=["bf16", "int8"],
        help="translation, beam search in these decode.precision settings against fp32",
    )
    ap.add_argument(
        "--baseline", metavar="REV", help="also time s2s generate of this tree against commit REV's"
    )
    ap.add_argument(
        "--baseline-precisions",
        nargs="+",
        default=["fp32", "bf16"],
        choices=["fp32", "bf16", "int8"],
    )
    ap.add_argument("--cache-dir", default=str(REPO / ".cache" / "s2s"))
    ap.add_argument("--name", default="decode_speed")
    args = ap.parse_args(argv)

    # an untrained model searches to the maximum length (full recompute: quadratically longer)
    def pick(value, trained, untrained, run):
        return value if value is not None else trained if run else untrained

    args.parsing_sentences = pick(args.parsing_sentences, 1000, 128, args.parsing_run)
    args.full_sentences = pick(args.full_sentences, 128, 16, args.run)
    args.parsing_full_sentences = pick(args.parsing_full_sentences, 16, 2, args.parsing_run)
    torch.set_num_threads(args.threads)
    result = {
        "benchmark": "decoding speed (issue 6b)",
        "threads": args.threads,
        "max_sentences": args.max_sentences,
        "runtime_env": runtime_env(),
        "load_avg_1m_start": machine()["load_avg_1m"],
        "clock": "rates: translate() as s2s generate runs it (tokenise, search, ids to text; on CPU "
        "run.threads batches at once, one thread each); full recompute ratio: generate() per batch",
    }
    mm = mm_rate()
    result["mm_rate_gflops"] = round(mm / 1e9, 1)
    # fp32 and bf16 at the shape of a beam-4 search step's feed-forward product in the
    # multi30k_en_de preset (d_model 256, d_ff 1,024) over max-sentences sentences
    shape = (4 * args.max_sentences, 256, 1024)
    result["mm_gflop_s_at_search_shape"] = mm_rates = {
        "shape": list(shape),
        **{
            str(dtype).split(".")[-1]: round(mm_rate(dtype=dtype, shape=shape) / 1e9, 1)
            for dtype in (torch.float32, torch.bfloat16)
        },
    }

    def of_mm_rates(rows: dict, section: dict, beam: int) -> None:
        """Each row's search FLOPs a second (s2s's count for the same search: greedy rows
        greedy's, the others the beam's) as a fraction of the fp32 and bf16 torch.mm rates
        measured at the search's shape."""
        for name, r in rows.items():
            if isinstance(r, dict) and "sentences_per_s" in r:
                search = "greedy" if "greedy" in name else f"beam{beam}"
                flops = r["sentences_per_s"] * section[search]["gflop_per_sentence"]
                r["of_mm_rate"] = {
                    k: round(flops / v, 3) for k, v in mm_rates.items() if k != "shape"
                }

    rows, ct2_rows, precision_rows, baseline_rows = [], [], [], []

    def measure(section: dict, task, model, settings, sources, full_subset: int, refs=None):
        beam = f"beam{settings.beam}"
        variants = {beam: settings, f"{beam}_stop_beam": replace(settings, stop="beam")}
        if refs is not None:
            variants["greedy"] = replace(settings, beam=1)
        measured, outputs = rates(model, task, sources, variants, args.repeats, args.max_sentences)
        section.update(measured)
        for r in measured.values():  # the search's matmul FLOPs at the machine's fp32 torch.mm rate
            r["mm_ceiling_sentences_per_s"] = round(mm / (r["gflop_per_sentence"] * 1e9), 1)
            r["fraction_of_mm_ceiling"] = round(
                r["sentences_per_s"] / r["mm_ceiling_sentences_per_s"], 3
            )
        if refs is not None:  # what the stopping rule costs in quality, if anything
            for name in variants:
                section[name]["test_score"] = round(task.score(outputs[name], refs).value, 2)
        if full_subset and "full" not in args.skip:
            section[f"{beam}_vs_full_recompute"] = v = versus_full(
                model, task, sources, settings, full_subset, args.max_sentences, args.repeats
            )
            section[beam]["full_recompute_sentences_per_s_extrapolated"] = round(
                section[beam]["sentences_per_s"] / v["speedup"], 3
            )
        for name in variants:
            r = section[name]
            rows.append(
                {
                    "task": section["task"],
                    "search": name,
                    "sent/s": r["sentences_per_s"],
                    "own cores": r["sentences_per_s_own_cores"],
                    "out tokens": r["mean_output_tokens"],
                    "ref tokens": section["mean_reference_tokens"],
                    "score": r.get("test_score"),
                    "vs full": section.get(f"{name}_vs_full_recompute", {}).get("speedup"),
                    "ceiling": r["mm_ceiling_sentences_per_s"],
                    "model": section["model"]["model"][:9],
                }
            )

    if "translation" not in args.skip:
        task, model, settings, desc = load("multi30k_en_de", args.run, args.cache_dir)
        path = MULTI30K / "test_2016_flickr.en"
        sources = path.read_text(encoding="utf-8").splitlines()[: args.sentences]
        refs = path.with_suffix(".de").read_text(encoding="utf-8").splitlines()[: args.sentences]
        decode_batch(
            model, task, sources[:4], batches_of(task, sources[:4], 4)[0], settings, True
        )  # warm-up
        t = result["translation"] = {
            "task": "translation",
            "model": desc,
            "data": f"{path.name}, first {len(sources)} lines",
            "mean_reference_tokens": round(sum(map(len, task.encode_target(refs))) / len(refs), 2),
            "score": "sacreBLEU against the references",
        }
        measure(t, task, model, settings, sources, args.full_sentences, refs)
        if "ctranslate2" not in args.skip and importlib.util.find_spec("ctranslate2") is not None:
            t["versus_ctranslate2"] = v = versus_ctranslate2(
                model,
                task,
                sources,
                refs,
                settings,
                args.threads,
                args.repeats,
                args.max_sentences,
                args.precisions,
            )
            of_mm_rates(v, t, settings.beam)
            ct2_rows.extend(
                {
                    "search": name,
                    "sent/s": r["sentences_per_s"],
                    "bleu": r["test_bleu"],
                    "vs s2s": r.get("speedup_vs_s2s"),
                    "outputs differing": r.get("sentences_differing_from_s2s"),
                }
                for name, r in v.items()
                if isinstance(r, dict)
            )
        if "precision" not in args.skip and args.precisions:
            t["precisions"] = precision_rates(
                model,
                task,
                sources,
                refs,
                settings,
                args.precisions,
                args.repeats,
                args.max_sentences,
            )
            of_mm_rates(t["precisions"], t, settings.beam)
            precision_rows.extend(
                {
                    "task": "translation",
                    "search": f"beam{settings.beam}_{name}",
                    "sent/s": r["sentences_per_s"],
                    "vs fp32": r["speed_vs_fp32_median"],
                    "score": r["test_score"],
                    "score vs fp32": r["test_score_vs_fp32"],
                }
                for name, r in t["precisions"].items()
            )
    if "parsing" not in args.skip:
        task, model, settings, desc = load("ptb_sample_parsing", args.parsing_run, args.cache_dir)
        pairs = list(
            islice(
                (p for split in ("valid", "test", "train") for p in task.read_split(split)),
                args.parsing_sentences,
            )
        )
        sources = [s for s, _ in pairs]
        p = result["parsing"] = {
            "task": "parsing",
            "model": desc,
            "data": f"NLTK treebank sample: {len(sources)} sentences (dev, test, then training)",
            "mean_reference_tokens": round(
                sum(map(len, task.encode_target([t for _, t in pairs]))) / len(pairs), 2
            ),
        }
        measure(p, task, model, settings, sources, args.parsing_full_sentences)
        p["constrained_vs_unconstrained"] = c = constraint_speed(
            model, task, sources, settings, args.repeats, args.max_sentences
        )
        print(
            f"parsing beam {c['beam']}: constrained {c['constrained_sentences_per_s']} sent/s, unconstrained "
            f"{c['unconstrained_sentences_per_s']} ({c['ratio']}x; target >= 0.8x)"
        )
    if args.baseline:
        jobs = {}
        if args.parsing_run:
            jobs["parsing"] = parsing_job(args.parsing_run)
        if args.run:
            jobs["translation"] = translation_job(args.run, args.sentences)
        result["versus_baseline"] = v = versus_baseline(
            args.baseline, jobs, args.threads, args.repeats, args.baseline_precisions
        )
        for name in jobs:
            baseline_rows.extend(
                {
                    "task": name,
                    "search": k,
                    "sent/s": r["sentences_per_s"],
                    "vs base fp32": r["speed_vs_baseline_fp32_median"],
                    "score": r["score"],
                }
                for k, r in v[name].items()
                if isinstance(r, dict)
            )
    result["targets"] = {
        "beam4_sentences_per_s_trained": 150,
        "beam4_incremental_vs_full": 5,
        "beam21_incremental_vs_full": 10,
        "beam4_best_precision_sentences_per_s": 200,
        "beam4_precision_test_bleu_within_fp32": 0.2,
    }
    result["mm_rate_gflops_end"] = round(mm_rate() / 1e9, 1)
    result["peak_rss_mib"] = round(peak_rss_mib(), 1)
    path = write(args.name, result)
    print(table(rows))
    if ct2_rows:
        print(table(ct2_rows))
    if precision_rows:
        print(table(precision_rows))
    if baseline_rows:
        print(table(baseline_rows))
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
