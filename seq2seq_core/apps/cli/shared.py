"""What several commands share: the tasks installed (with any `--plugin`), and a preset's config
merged with the command line's overrides."""

from __future__ import annotations


def registry_of(args):
    """The tasks the command may use: the installed entry points and each `--plugin` given."""
    from ...setup.registry import Registry

    return Registry.installed(args.plugin or [])


def config_of(args):
    """(config, registry) of a command that takes PRESET [key=value ...]."""
    from ...setup.config import load_config

    registry = registry_of(args)
    registry.not_a_preset(args.preset)  # `s2s train translation`: name its presets
    return load_config(args.preset, args.overrides, registry=registry), registry
