"""Presets load and validate; overrides apply; errors name the key and the nearest valid one."""

import pytest
import torch
from omegaconf import OmegaConf
from s2s.core.errors import ConfigError
from s2s.core.nn.model import Transformer
from s2s.core.setup.config import load_config, preset_names


@pytest.mark.parametrize("preset", preset_names())
def test_every_preset_loads_validates_and_builds(preset, registry):
    cfg = load_config(preset, registry=registry)
    sections = [cfg.task] if cfg.tasks is None else [m.task for m in cfg.tasks.values()]
    assert sections and all(t.name in registry.names() for t in sections)
    with torch.device("meta"):  # the big presets cost no memory
        model = Transformer(cfg.model, 1000, 1000, shared_vocab=True)
    assert sum(p.numel() for p in model.parameters()) > 0


def test_every_preset_starts_with_the_command_that_runs_it():
    from s2s.core.setup.config import PRESET_DIR

    for path in PRESET_DIR.glob("*.yaml"):
        first = path.read_text().splitlines()[0]
        assert first.startswith("# s2s "), f"{path.name} starts with {first!r}"


def test_override_changes_a_field(registry):
    cfg = load_config(
        "demo", ["model.layers=3", "optim.warmup=7", "task.mode=parse"], registry=registry
    )
    assert (cfg.model.layers, cfg.optim.warmup, cfg.task.mode) == (3, 7, "parse")


@pytest.mark.parametrize(
    "override, named",
    [
        (["model.layer=3"], "'model.layers'"),
        (["optim.warmpu=10"], "'optim.warmup'"),
        (["task.mdoe=parse"], "'task.mode'"),
        (["modle.layers=2"], "'model'"),
        (["model.layers=many"], "model.layers"),
        (["optim.lr_scale=fast"], "optim.lr_scale"),
    ],
)
def test_config_errors_name_the_key(override, named, registry):
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        load_config("demo", override, registry=registry)


def test_unknown_preset_lists_the_known_ones(registry):
    with pytest.raises(ConfigError, match="known presets: .*demo"):
        load_config("dmeo", registry=registry)


def test_unknown_task_lists_the_known_ones(registry, tmp_path):
    from s2s.core.errors import RegistryError

    path = tmp_path / "p.yaml"
    path.write_text("task:\n  name: nosuchtask\n")
    with pytest.raises(RegistryError, match="known tasks: .*demo"):
        load_config(str(path), registry=registry)


def test_yaml_path_preset(registry, tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("task:\n  name: demo\nmodel:\n  layers: 2\n")
    cfg = load_config(str(path), registry=registry)
    assert cfg.model.layers == 2 and cfg.model.d_model == 512


def test_print_config_prints_merged_yaml(capsys):
    from s2s.core.apps.cli import main

    assert main(["train", "demo", "model.layers=5", "--print-config"]) == 0
    printed = OmegaConf.create(capsys.readouterr().out)
    assert printed.model.layers == 5 and printed.task.name == "demo"
