"""Shared fixtures: real data locations, a registry, a tiny config maker."""
from __future__ import annotations

import os

os.environ.setdefault("GOMP_SPINCOUNT", "1000")  # before torch: see seq2seq_core/cli.py

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)  # tiny models: one thread beats two on a shared 2-core machine


@pytest.fixture(autouse=True)
def one_thread():
    """Tests use tiny models: one thread is as fast, and much faster on a shared, busy machine.

    Restored after each test, since a training run sets its own `run.threads`."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def registry():
    from s2s.core.registry import Registry

    return Registry.installed()


@pytest.fixture
def tiny(tmp_path):
    """Overrides that make any preset tiny and keep its files under tmp_path."""
    def make(*extra: str) -> list[str]:
        return ["model.layers=1", "model.d_model=32", "model.d_ff=64", "model.heads=2",
                f"run.dir={tmp_path / 'run'}", f"data.cache_dir={tmp_path / 'cache'}",
                "run.log_interval=5", "run.quiet=true", "run.threads=1", *extra]
    return make
