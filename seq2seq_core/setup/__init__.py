"""Setup: a run's settings before any work, in the order a run reads them: the sections and their
defaults (`settings`), a preset merged with the command line's overrides and checked
(`config`), and where the tasks come from (`registry`). Imports the contract and the root."""
