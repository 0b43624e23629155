"""A sweep: variants of one preset, each a list of overrides trained to the same budget in its own
run directory SWEEP_DIR/NAME, one after another, then one table and one plot per varied setting.

The variants are a grid (the cartesian product of `KEY=V1,V2` options) or a YAML list of override
mappings, each optionally named. SWEEP_DIR/sweep.json (the manifest: preset, common overrides,
budget, variants and their state) makes the sweep resumable: the same command again skips the
variants that have a result.json, resumes an interrupted one through its run directory (bit for bit,
`s2s.core.training.trainer`) and trains the rest; a finished sweep only rewrites results.md,
results.json and the plots. Another sweep in the same folder is an error naming sweep.json. Every
variant's config is loaded and checked before the first one trains.

The modules: `variants` (the plan: variants and what each run gets; no torch, the command line
reads it while it parses), `runner` (the checks, the manifest, the training), `results` (the
table and the plots).
"""
