"""The GPU path: bf16 autocast, fp16 with dynamic loss scaling, beam search on CUDA.

Marked `gpu` and skipped without CUDA; `bench/training/gpu_check.sh` runs them (`pytest -m gpu`).
"""

import json

import pytest
import torch
from omegaconf import OmegaConf
from s2s.core.contract.task import DecodeDefaults
from s2s.core.decode.search import search
from s2s.core.nn.model import Transformer
from s2s.core.setup.config import load_config
from s2s.core.setup.settings import ModelConfig
from s2s.core.runs import checkpoint
from s2s.core.training.trainer import train
from s2s.core.tokenizers import EOS

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _train(registry, tiny, precision):
    cfg = load_config(
        "demo",
        tiny(
            "task.train_size=400",
            "task.valid_size=8",
            "task.test_size=8",
            "data.max_tokens=600",
            "optim.warmup=5",
            "optim.max_updates=6",
            "run.log_interval=1",
            "run.save_interval=3",
            "run.valid_interval=3",
            "run.device=cuda",
            f"run.precision={precision}",
        ),
        registry=registry,
    )
    result = train(cfg, registry, quiet=True)
    records = [json.loads(line) for line in open(f"{cfg.run.dir}/metrics.jsonl")]
    state = checkpoint.load(checkpoint.listed(cfg.run.dir)[-1])
    return result, records, state


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_training_on_cuda(registry, tiny, precision):
    result, records, state = _train(registry, tiny, precision)
    assert result["update"] == 6
    losses = [r["loss"] for r in records if r["kind"] == "train"]
    assert len(losses) == 6 and all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]
    # bf16 / fp16 compute in low precision; the parameters (and Adam's moments) stay fp32
    assert all(v.dtype == torch.float32 for v in state["model"].values() if v.is_floating_point())
    assert all(torch.isfinite(v).all() for v in state["model"].values())
    if precision == "fp16":  # dynamic loss scaling: a scale is kept and saved
        assert state["scaler"]["scale"] > 0 and "_growth_tracker" in state["scaler"]
    else:
        assert state["scaler"] == {}
    assert state["global_batch"] == {"max_tokens": 600, "update_freq": 1, "processes": 1}


def test_beam_search_on_cuda_equals_cpu():
    torch.manual_seed(0)
    cfg = OmegaConf.structured(ModelConfig(layers=2, d_model=64, d_ff=128, heads=4, dropout=0.0))
    model = Transformer(cfg, 50, 50, shared_vocab=True).eval()
    src = torch.randint(4, 50, (8, 12))
    src[:, -1] = EOS
    src[4:, 8:] = 0  # some shorter sources, padded
    src[4:, 7] = EOS
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 on both sides
    try:
        on_cpu = search(model, src, DecodeDefaults(beam=4, alpha=0.6, max_len_a=1.0, max_len_b=10))
        on_gpu = search(
            model.cuda(), src.cuda(), DecodeDefaults(beam=4, alpha=0.6, max_len_a=1.0, max_len_b=10)
        )
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    same = 0
    for c, g in zip(on_cpu, on_gpu):
        assert abs(c.score - g.score) < 1e-4, (c, g)  # a different choice only at a rounding tie
        same += c.tokens == g.tokens
    assert same >= len(on_cpu) - 1, (on_cpu, on_gpu)
