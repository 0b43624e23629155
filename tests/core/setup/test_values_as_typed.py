"""Values as the user typed them (issue 24): overrides typed only by their field's declared type,
`~` in paths, checked language codes, settings that used to end as "internal error", an overall
download deadline, and fetched data files verified before every use.

Command-line cases go through the real CLI (`main`) and assert the exit code, one line naming
the key and the value, and no traceback; pure config behaviour goes through `load_config`.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
from omegaconf import OmegaConf
from s2s.core.apps.cli import main
from s2s.core.errors import ConfigError
from s2s.core.setup.config import load_config, single_task
from s2s.core.setup.settings import (
    MIN_TEMPERATURE,
    SEED_MAX,
    WEIGHT_RANGE,
    Precision,
    Stop,
)


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _fails(capsys, *argv: str, needles: tuple[str, ...]) -> str:
    """The command exits 2 with one error line that holds every needle, and no traceback."""
    code, _, err = _cli(capsys, *argv)
    assert "Traceback" not in err and "internal error" not in err, err
    assert code == 2, (code, err)
    errors = [line for line in err.splitlines() if ": error: " in line]
    assert len(errors) == 1, err
    for needle in needles:
        assert needle in errors[0], (needle, errors[0])
    return errors[0]


def _printed(capsys, *overrides: str, preset: str = "demo"):
    code, out, err = _cli(capsys, "train", preset, "--print-config", *overrides)
    assert code == 0, err
    return OmegaConf.create(out)


# -- 1. override values are the strings the user typed, typed by the field ---------------------------
@pytest.mark.parametrize(
    "value",
    [
        "runs/a #1",
        "runs/a\nb",
        "null",
        "[]",
        "{}",
        "no",
        "a=b",
        " x ",
        "${x}",
        "a\\${x}",
        "${oc.env:HOME}",
        "'quoted'",
        "1e3",
        "~x",
    ],
)
def test_a_string_setting_is_exactly_what_was_typed(registry, value):
    cfg = load_config("demo", [f"run.dir={value}"], registry=registry)
    assert cfg.run.dir == value


def test_print_config_keeps_a_hash_in_a_path(capsys, tmp_path):
    printed = _printed(capsys, "run.dir=runs/a #1")
    assert printed.run.dir == "runs/a #1"
    printed = _printed(capsys, "run.dir=${x}", f"data.cache_dir={tmp_path}/c #2")
    assert printed.run.dir == "${x}" and printed.data.cache_dir == f"{tmp_path}/c #2"


def test_a_literal_dollar_brace_survives_the_runs_config_file(registry, tmp_path):
    cfg = load_config("demo", ["run.dir=runs/${x}", "task.mode=parse"], registry=registry)
    saved = tmp_path / "config.yaml"
    saved.write_text(OmegaConf.to_yaml(cfg), encoding="utf-8")  # what train writes
    again = load_config(saved, ["decode.beam=3"], registry=registry)
    assert again.run.dir == "runs/${x}" and again.decode.beam == 3 and again.task.mode == "parse"


def test_a_language_code_that_yaml_would_read_as_false(registry):
    cfg = load_config(
        "multi30k_en_de", ["task.tgt_lang=no", "task.data_dir=/data/nb"], registry=registry
    )
    assert cfg.task.tgt_lang == "no"  # Norwegian, not False
    cfg = load_config(
        "multi30k_en_de", ["task.hub_config=null", "task.data_dir=/d"], registry=registry
    )
    assert cfg.task.hub_config == "null"  # a str field that is not Optional keeps the word


@pytest.mark.parametrize(
    "override, key, value",
    [
        ("model.layers=1_000", "layers", 1000),
        ("model.layers= 7 ", "layers", 7),
        ("optim.eps=1e-3", "eps", 1e-3),
        ("optim.lr_scale=2", "lr_scale", 2.0),
        ("optim.clip_norm=1_0.5", "clip_norm", 10.5),
    ],
)
def test_numbers_are_read_as_python_reads_them(registry, override, key, value):
    cfg = load_config("demo", [override], registry=registry)
    section = cfg[override.split(".")[0]]
    assert section[key] == value and type(section[key]) is type(value)


@pytest.mark.parametrize(
    "override, shown",
    [
        ("model.layers=1e3", "model.layers='1e3': must be a whole number"),
        ("model.layers=3.0", "model.layers='3.0': must be a whole number"),
        ("model.layers=", "model.layers='': must be a whole number"),
        ("model.layers=null", "model.layers='null': must be a whole number"),
        ("optim.lr_scale=fast", "optim.lr_scale='fast': must be a number"),
        ("decode.beam=many", "decode.beam='many': must be a whole number (or null)"),
        ("run.quiet=maybe", "run.quiet='maybe': must be true or false"),
        (
            "run.precision=BF16",
            "run.precision='BF16': must be one of fp32, bf16, fp16, auto (did you mean 'bf16'?)",
        ),
        ("decode.stop=never", "decode.stop='never': must be one of bound, beam"),
        ("task.seed=one", "task.seed='one': must be a whole number"),
        ("model.layers.deep=3", "'model.layers' is a setting, not a section"),
        ("model.layer=3", "did you mean 'model.layers'?"),
        ("run=0", "'run' is a section"),
        ("=3", "bad override '=3'"),
        ("model..layers=3", "bad override 'model..layers=3'"),
    ],
)
def test_a_value_its_field_cannot_take_names_key_and_value(capsys, override, shown):
    _fails(capsys, "train", "demo", override, "--print-config", needles=(shown,))


@pytest.mark.parametrize(
    "typed, expected",
    [
        ("true", True),
        ("TRUE", True),
        ("Yes", True),
        ("1", True),
        ("false", False),
        ("No", False),
        ("0", False),
        ("FALSE", False),
    ],
)
def test_booleans(registry, typed, expected):
    assert load_config("demo", [f"run.quiet={typed}"], registry=registry).run.quiet is expected


def test_optional_and_enum_fields(registry):
    cfg = load_config(
        "demo",
        [
            "decode.beam=null",
            "model.tie_output=None",
            "decode.alpha=0.5",
            "decode.stop=beam",
            "run.precision=bf16",
        ],
        registry=registry,
    )
    assert cfg.decode.beam is None and cfg.model.tie_output is None and cfg.decode.alpha == 0.5
    assert cfg.decode.stop == Stop.beam and cfg.run.precision == Precision.bf16
    cfg = load_config(
        "demo", ["decode.beam=5", "model.tie_output=no", "decode.stop=NULL"], registry=registry
    )
    assert cfg.decode.beam == 5 and cfg.model.tie_output is False and cfg.decode.stop is None


def test_task_keys_are_typed_by_the_tasks_config(registry):
    cfg = load_config("demo", ["task.seed=0_7", "task.mode=parse"], registry=registry)
    assert cfg.task.seed == 7 and cfg.task.mode == "parse"
    cfg = load_config(
        None,
        ["task.name=translation", "task.drop_empty=No", "task.vocab_size=1_000"],
        registry=registry,
    )
    assert cfg.task.drop_empty is False and cfg.task.vocab_size == 1000
    cfg = load_config(
        "multitask_demo",
        ["tasks.parse.task.seed=5", "tasks.parse.weight=2", "tasks.translate.select=0"],
        registry=registry,
    )
    assert (
        cfg.tasks.parse.task.seed == 5
        and cfg.tasks.parse.weight == 2.0
        and cfg.tasks.translate.select == 0.0
    )
    with pytest.raises(ConfigError, match=r"tasks\.parse\.task\.seed='x': must be a whole number"):
        load_config("multitask_demo", ["tasks.parse.task.seed=x"], registry=registry)
    with pytest.raises(
        ConfigError, match=r"'tasks\.parse\.task\.mdoe'; did you mean 'tasks\.parse\.task\.mode'"
    ):
        load_config("multitask_demo", ["tasks.parse.task.mdoe=x"], registry=registry)


def test_presets_stay_yaml(registry, tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text(
        "task: {name: demo}\nrun:\n  dir: runs/p # a comment\n  quiet: true\n"
        "decode: {beam: null}\n",
        encoding="utf-8",
    )
    cfg = load_config(path, registry=registry)
    assert cfg.run.dir == "runs/p" and cfg.run.quiet is True and cfg.decode.beam is None
    cfg = load_config(path, ["run.dir=runs/p # a comment"], registry=registry)
    assert cfg.run.dir == "runs/p # a comment"


def test_the_last_of_two_overrides_wins_and_the_first_equals_sign_splits(registry):
    cfg = load_config(
        "demo", ["model.layers=3", "model.layers=4", "run.dir=x=y=z"], registry=registry
    )
    assert cfg.model.layers == 4 and cfg.run.dir == "x=y=z"


# -- 2. a leading ~ in a path is the home folder ------------------------------------------------------
def test_engine_and_task_paths_expand_the_home_folder(registry, monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    cfg = load_config("demo", ["run.dir=~/runs/a", "data.cache_dir=~"], registry=registry)
    assert cfg.run.dir == f"{tmp_path}/runs/a" and cfg.data.cache_dir == str(tmp_path)
    cfg = load_config(
        "multi30k_en_de", ["task.data_dir=~/m30k", "task.local_dir=~/wmt"], registry=registry
    )
    assert cfg.task.data_dir == f"{tmp_path}/m30k" and cfg.task.local_dir == f"{tmp_path}/wmt"
    cfg = load_config(
        "ptb_sample_parsing",
        [
            "task.nltk_data=~/nd",
            "task.silver_trees=~/s.txt",
            "task.wsj_root=~/wsj",
            "task.train_file=~/t.txt",
        ],
        registry=registry,
    )
    assert (cfg.task.nltk_data, cfg.task.silver_trees, cfg.task.wsj_root, cfg.task.train_file) == (
        f"{tmp_path}/nd",
        f"{tmp_path}/s.txt",
        f"{tmp_path}/wsj",
        f"{tmp_path}/t.txt",
    )
    cfg = load_config("demo", ["run.dir=runs/~a", "task.mode=parse"], registry=registry)
    assert cfg.run.dir == "runs/~a"  # only a leading ~
    preset = tmp_path / "p.yaml"
    preset.write_text("task: {name: demo}\nrun: {dir: ~/from_yaml}\n", encoding="utf-8")
    assert load_config(preset, registry=registry).run.dir == f"{tmp_path}/from_yaml"


def test_a_member_task_path_expands_too(registry, monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    cfg = load_config(
        "ptb_sample_parsing_multi30k", ["tasks.translate.task.data_dir=~/m30k"], registry=registry
    )
    assert cfg.tasks.translate.task.data_dir == f"{tmp_path}/m30k"


# -- 3. language codes --------------------------------------------------------------------------------
@pytest.fixture
def score_files(tmp_path):
    ref, hyp = tmp_path / "ref.txt", tmp_path / "hyp.txt"
    ref.write_text("Un homme qu'on voit.\nUne femme joue.\n", encoding="utf-8")
    hyp.write_text("Un homme que l'on voit.\nUne femme joue.\n", encoding="utf-8")
    return ["--ref", str(ref), "--hyp", str(hyp), "--json"]


@pytest.mark.parametrize(
    "override, needles",
    [
        ("task.tgt_lang=FR", ("task.tgt_lang='FR'", "lower-case ISO 639-1", "did you mean 'fr'?")),
        ("task.src_lang=En", ("task.src_lang='En'", "did you mean 'en'?")),
        ("task.tgt_lang=xx", ("task.tgt_lang='xx'", "ISO 639-1")),
        ("task.tgt_lang=deu", ("task.tgt_lang='deu'", "ISO 639-1")),
        ("task.tgt_lang=de-DE", ("task.tgt_lang='de-DE'", "'de'")),
        ("task.tgt_lang=", ("task.tgt_lang=''", "ISO 639-1")),
        ("task.tgt_lang=en", ("task.src_lang and task.tgt_lang are both 'en'",)),
    ],
)
def test_a_language_code_is_checked_when_the_config_loads(capsys, score_files, override, needles):
    _fails(capsys, "score", "translation", override, *score_files, needles=needles)


def test_languages_with_and_without_rules_of_their_own(capsys, score_files, caplog):
    import json

    code, out, err = _cli(capsys, "score", "translation", "task.tgt_lang=fr", *score_files)
    assert code == 0, err
    assert "tok:moses-fr+atat" in json.loads(out)["bleu_tok_signature"]
    with caplog.at_level(logging.INFO):
        code, out, err = _cli(capsys, "score", "translation", "task.tgt_lang=cs", *score_files)
    assert code == 0, err
    assert (
        "tok:moses-generic+atat" in json.loads(out)["bleu_tok_signature"]
    )  # no Czech rules: said so
    assert any(
        "generic Moses rules" in r.getMessage() and "tgt_lang=cs" in r.getMessage()
        for r in caplog.records
    )


def test_the_presets_languages_load(registry):
    for preset, pair in [
        ("multi30k_en_de", ("en", "de")),
        ("multi30k_en_fr", ("en", "fr")),
        ("wmt14_en_de_base", ("en", "de")),
        ("wmt14_en_fr_big", ("en", "fr")),
    ]:
        cfg = load_config(preset, registry=registry)
        assert (cfg.task.src_lang, cfg.task.tgt_lang) == pair
    cfg = load_config(
        "wmt14_en_de_base", ["task.src_lang=de", "task.tgt_lang=en"], registry=registry
    )
    assert cfg.task.src_lang == "de"


def test_source_specific_language_pairs(registry):
    with pytest.raises(
        ConfigError, match=r"task\.tgt_lang='cs': Multi30k is fetched in en, de, fr"
    ):
        load_config("multi30k_en_de", ["task.tgt_lang=cs"], registry=registry)
    assert load_config(
        "multi30k_en_de", ["task.tgt_lang=cs", "task.data_dir=/copy"], registry=registry
    )
    with pytest.raises(ConfigError, match="WMT14 pairs English with another language"):
        load_config("wmt14_en_de_base", ["task.src_lang=fr"], registry=registry)


# -- 4. settings that used to fail later as "internal error" ------------------------------------------
@pytest.mark.parametrize(
    "overrides, needles",
    [
        (["task.vocab_size=100"], ("task.vocab_size=100", ">= 260", "task.tokenizer=bpe")),
        (["task.tokenizer=wordpiece", "task.vocab_size=300"], ("task.vocab_size=300", ">= 516")),
        (["run.seed=-1"], ("run.seed=-1", "[0, 4294967295]")),
        ([f"run.seed={2**32}"], (f"run.seed={2**32}", "[0, 4294967295]")),
        (["model.d_model=33", "model.heads=3"], ("model.d_model=33", "even")),
        (["model.output_bias_fixed=true"], ("model.output_bias_fixed=true", "output_bias=true")),
    ],
)
def test_settings_that_would_fail_later_fail_at_once(capsys, tmp_path, overrides, needles):
    _fails(
        capsys,
        "train",
        "multi30k_en_de",
        f"task.data_dir={tmp_path}",
        *overrides,
        "--print-config",
        needles=needles,
    )


def test_the_edges_of_the_ranges_load(registry, tmp_path):
    cfg = load_config(
        "multi30k_en_de",
        [
            f"task.data_dir={tmp_path}",
            "task.vocab_size=260",
            f"run.seed={SEED_MAX}",
            "run.seed=0",
            "model.d_model=34",
            "model.heads=2",
        ],
        registry=registry,
    )
    assert cfg.task.vocab_size == 260 and cfg.run.seed == 0
    assert load_config("demo", [f"run.seed={SEED_MAX}"], registry=registry).run.seed == 2**32 - 1
    np.random.default_rng([SEED_MAX, 1])  # the run's uses of the seed take the largest one
    np.random.seed(SEED_MAX % 2**32)


def test_a_cuda_device_without_cuda(capsys, monkeypatch, registry):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    _fails(
        capsys,
        "train",
        "demo",
        "run.device=cuda",
        "--print-config",
        needles=("run.device='cuda'", "CUDA", "cpu"),
    )
    _fails(
        capsys,
        "train",
        "demo",
        "run.device=cuda:1",
        "--print-config",
        needles=("run.device='cuda:1'",),
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert load_config("demo", ["run.device=cuda"], registry=registry).run.device == "cuda"
    with pytest.raises(ConfigError, match=r"run\.device='cuda:1': there are 1 CUDA devices"):
        load_config("demo", ["run.device=cuda:1"], registry=registry)


@pytest.mark.parametrize(
    "override, needles",
    [
        ("multitask.temperature=0.01", ("multitask.temperature=0.01", f">= {MIN_TEMPERATURE}")),
        ("multitask.temperature=1e-300", ("multitask.temperature=1e-300",)),
        ("tasks.parse.weight=1e300", ("tasks.parse.weight=1e+300", "[1e-06, 1e+06]")),
        ("tasks.parse.weight=1e-300", ("tasks.parse.weight=1e-300",)),
        ("tasks.parse.select=1e300", ("tasks.parse.select=1e+300",)),
    ],
)
def test_multitask_sampling_that_would_overflow(capsys, override, needles):
    _fails(capsys, "train", "multitask_demo", override, "--print-config", needles=needles)


def test_the_sampling_bounds_keep_the_probabilities_finite():
    from types import SimpleNamespace

    from s2s.core.training.schedule import probabilities

    def member(n, weight):
        return SimpleNamespace(weight=weight, data=SimpleNamespace(pairs={"train": n}))

    lo, hi = WEIGHT_RANGE
    for members in (
        [member(10**12, hi), member(1, lo)],
        [member(1, lo), member(1, lo)],
        [member(10**12, hi)] * 50,
    ):
        p = probabilities(members, MIN_TEMPERATURE)
        assert np.isfinite(p).all() and p.sum() == pytest.approx(1.0)


def test_a_broken_member_preset_names_its_file(capsys, tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("task: {name: demo\nmodel: [\n", encoding="utf-8")
    preset = tmp_path / "multi.yaml"
    preset.write_text(
        f"tasks:\n  a: {{preset: {broken}}}\n  b: {{preset: demo}}\n", encoding="utf-8"
    )
    _fails(
        capsys,
        "train",
        str(preset),
        "--print-config",
        needles=("tasks.a.preset=", str(broken), "line"),
    )
    preset.write_text(f"tasks:\n  a: {{preset: {tmp_path / 'missing.yaml'}}}\n", encoding="utf-8")
    _fails(
        capsys,
        "train",
        str(preset),
        "--print-config",
        needles=("tasks.a.preset=", "missing.yaml", "does not exist"),
    )
    unreadable = tmp_path / "folder.yaml"
    unreadable.mkdir()
    preset.write_text(f"tasks:\n  a: {{preset: {unreadable}}}\n", encoding="utf-8")
    _fails(
        capsys, "train", str(preset), "--print-config", needles=("tasks.a.preset=", "folder.yaml")
    )


def test_a_multi_task_config_where_one_task_is_needed(registry):
    cfg = load_config("multitask_demo", registry=registry)
    with pytest.raises(
        ConfigError,
        match=r"preset 'multitask_demo' is a multi-task config \(members "
        r"translate \(demo\), parse \(demo\)\)",
    ):
        single_task(cfg, "preset 'multitask_demo'")
    one = load_config("demo", registry=registry)
    assert single_task(one, "preset 'demo'") is one


def test_score_with_a_multi_task_preset(capsys, score_files):
    _fails(
        capsys, "score", "multitask_demo", *score_files, needles=("multitask_demo", "multi-task")
    )
