"""Precision: bf16 training with fp32 master weights, auto / fallback, bf16 and int8 search."""

import ctypes
import json
import logging
import os
import subprocess
import sys

import pytest
import torch
from s2s.core.contract.task import DecodeDefaults
from s2s.core import MALLOC_SETTINGS, RUNTIME_ENV
from s2s.core.decode.search import search
from s2s.core.nn import precision
from s2s.core.nn.model import Transformer
from s2s.core.setup.settings import ModelConfig


def _model(seed=0):
    cfg = ModelConfig(layers=2, d_model=32, d_ff=64, heads=2, dropout=0.0, max_positions=64)
    torch.manual_seed(seed)
    return Transformer(cfg, 40, 40, shared_vocab=True)


def _batch():
    g = torch.Generator().manual_seed(1)
    return (
        torch.randint(4, 40, (6, 7), generator=g),
        torch.randint(4, 40, (6, 5), generator=g),
        torch.randint(4, 40, (6, 5), generator=g),
    )


def _grads(model, net):
    src, tgt_in, tgt_out = _batch()
    model.zero_grad()
    net(src, tgt_in, tgt_out, 0.1)[0].backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def test_bf16_computes_in_bf16_and_accumulates_fp32_gradients_into_the_fp32_parameters():
    model = _model()
    net, autocast = precision.for_training(model, "bf16", torch.device("cpu"))
    with autocast():
        assert net(*_batch()[:2]).dtype == torch.bfloat16
    low, full = _grads(model, net), _grads(model, model)
    for name, p in model.named_parameters():  # the parameters are the fp32 leaves again, still tied
        assert p.dtype == torch.float32 and p.is_leaf and low[name].dtype == torch.float32
        if name.endswith(
            "w_k.bias"
        ):  # its gradient is 0 up to rounding: softmax ignores a shift of all scores
            continue
        cos = torch.nn.functional.cosine_similarity(
            low[name].flatten(), full[name].flatten(), dim=0
        )
        assert cos > 0.98, (name, cos)
    assert model.out.weight is model.tgt_embed.weight is model.src_embed.weight
    assert model.pe.dtype == torch.float32


def test_auto_means_bf16_where_the_cpu_has_it_and_bf16_falls_back_to_fp32_with_a_warning(
    monkeypatch, caplog
):
    cpu = torch.device("cpu")
    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: True)
    assert precision.resolve("auto", cpu) == "bf16" and precision.resolve("bf16", cpu) == "bf16"
    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: False)
    assert precision.resolve("auto", cpu) == "fp32" and not caplog.records
    with caplog.at_level(logging.WARNING, logger="s2s"):
        assert precision.resolve("bf16", cpu, "decode.precision") == "fp32"
    assert (
        "decode.precision=bf16: this CPU has no native bf16 arithmetic, computing in fp32"
        in caplog.text
    )
    assert precision.resolve("int8", cpu) == "int8" and precision.resolve("fp32", cpu) == "fp32"


def test_search_precision_auto_is_the_default_and_bf16_only_on_matrix_units(monkeypatch):
    """decode.precision=auto (the default): bf16 on a CPU with AMX, fp32 on one with
    avx512_bf16 alone (which still trains in bf16) and on one without bf16; a Volta GPU gets
    fp32, not training's fp16 (search has no fp16 model)."""
    from s2s.core.setup.settings import DecodeConfig, SearchPrecision

    assert DecodeConfig().precision == SearchPrecision.auto
    cpu = torch.device("cpu")
    for flags, searched in (
        ("amx_bf16 avx512_bf16", "bf16"),
        ("avx512_bf16", "fp32"),
        ("", "fp32"),
    ):
        monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset(flags.split()))
        assert precision.resolve_search(SearchPrecision.auto, cpu) == searched, flags
    assert precision.resolve("auto", cpu) == "fp32"  # no bf16 at all
    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset({"avx512_bf16"}))
    assert precision.resolve("auto", cpu) == "bf16"
    assert precision.resolve_search("int8", cpu) == "int8"
    monkeypatch.setattr(precision, "cuda_capability", lambda device: (7, 0))
    assert precision.resolve_search("auto", torch.device("cuda")) == "fp32"


@pytest.mark.parametrize("kind", ["bf16", "int8"])
def test_search_copies_leave_the_model_alone_and_give_the_same_search_up_to_rounding(kind):
    model = _model().eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    searched = precision.for_inference(model, kind)
    assert searched is not model
    for k, v in model.state_dict().items():
        assert v.dtype == torch.float32 and torch.equal(v, before[k])
    if kind == "int8":
        assert type(searched.decoder[0].ffn[0]).__module__.startswith("torch.ao.nn.quantized")
    src = _batch()[0]
    with torch.no_grad():
        ref = model.decode(src[:, :4], *model.encode(src)).float()
        got = searched.decode(src[:, :4], *searched.encode(src)).float()
    assert (got - ref).abs().max() < 0.05 * ref.abs().max()
    # the same exact search on the converted model: outputs of the same form, one per sentence
    hyps = search(searched, src, DecodeDefaults(beam=3, alpha=0.6, max_len_a=1.0, max_len_b=3))
    assert len(hyps) == len(src) and all(len(h.tokens) <= src.size(1) + 3 for h in hyps)


def test_fp32_search_copy_multiplies_with_onednn_and_searches_as_the_model():
    """On CPU the fp32 copy's linear layers are RowPaddedLinear (oneDNN's product, padded
    rows): each output the plain layer's up to fp32 rounding, the same search; the trained
    model keeps its own layers, and a copy converted again starts from plain ones (int8 then
    quantises every linear layer)."""
    model = _model().eval()
    searched = precision.for_inference(model, "fp32")
    assert searched is not model and precision.onednn_linear()
    assert all(
        type(m) is torch.nn.Linear for m in model.modules() if isinstance(m, torch.nn.Linear)
    )
    layer = searched.decoder[0].ffn[0]
    assert type(layer) is precision.RowPaddedLinear
    x = torch.randn(3, 5, layer.in_features)
    with torch.no_grad():
        got, ref = layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    src, settings = _batch()[0], DecodeDefaults(beam=3, alpha=0.6, max_len_a=1.0, max_len_b=3)
    mine, theirs = search(searched, src, settings), search(model, src, settings)
    assert [h.tokens for h in mine] == [h.tokens for h in theirs]
    assert [h.score for h in mine] == pytest.approx([h.score for h in theirs], abs=1e-5)
    again = precision.for_inference(searched, "int8")
    assert type(again.decoder[0].ffn[0]).__module__.startswith("torch.ao.nn.quantized")


def test_bf16_search_pads_the_rows_of_its_linear_layers_without_changing_a_search():
    """On CPU the bf16 copy's linear layers pad their rows to a multiple of ROWS (so that oneDNN
    meets few shapes); each row's output is the unpadded layer's, and so is the search."""
    model = _model().eval()
    searched = precision.for_inference(model, "bf16")
    linears = [m for m in searched.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(type(m) is precision.RowPaddedLinear for m in linears)
    layer = searched.decoder[0].ffn[0]
    x = torch.randn(3, 5, layer.in_features).bfloat16()  # 15 rows: padded to ROWS
    got = layer(x)
    ref = torch.nn.functional.linear(x, layer.weight, layer.bias)
    assert got.shape == ref.shape and torch.allclose(got.float(), ref.float(), atol=1e-2)
    plain = precision.for_inference(model, "bf16")
    for m in plain.modules():
        if type(m) is precision.RowPaddedLinear:
            m.__class__ = torch.nn.Linear
    src, settings = _batch()[0], DecodeDefaults(beam=3, alpha=0.6, max_len_a=1.0, max_len_b=3)
    assert search(searched, src, settings) == search(plain, src, settings)


def test_padded_rows_add_at_most_a_sixteenth_and_few_row_counts():
    rows = (1, 32, 33, 1000, 1024, 1025, 2048, 2049)
    padded = (32, 32, 64, 1024, 1024, 1088, 2048, 2176)
    assert tuple(precision.padded_rows(n) for n in rows) == padded
    counts = {precision.padded_rows(n) for n in range(1024, 4096)}
    assert len(counts) == 33  # 1,024 and 16 a doubling
    assert all(n <= precision.padded_rows(n) <= n + max(32, n // 16) for n in range(1, 9000))


def test_bf16_training_pads_the_rows_of_every_product_forward_and_backward():
    """bf16 training on a CPU makes the linear layers RowPaddedLinear: the forward product, the
    input's gradient and the weight's gradient (a product over the rows) all meet a padded row
    count, and each output and gradient is the unpadded layer's."""
    model = _model()
    precision.for_training(model, "bf16", torch.device("cpu"))
    layer = model.decoder[0].ffn[0]
    assert type(layer) is precision.RowPaddedLinear
    w = layer.weight.detach().bfloat16().requires_grad_()
    b = layer.bias.detach().bfloat16().requires_grad_()
    layer.weight, layer.bias = torch.nn.Parameter(w), torch.nn.Parameter(b)
    x = torch.randn(5, 7, layer.in_features).bfloat16().requires_grad_()  # 35 rows: 64
    g = torch.randn(5, 7, layer.out_features).bfloat16()
    with torch.profiler.profile(record_shapes=True) as prof:
        layer(x).backward(g)
    products = [e for e in prof.events() if e.name in ("aten::addmm", "aten::mm")]
    assert len(products) == 3
    assert all(64 in [d for shape in e.input_shapes for d in shape] for e in products)
    out = layer(x)
    got = (out, *torch.autograd.grad(out, (x, layer.weight, layer.bias), g))
    x2 = x.detach().requires_grad_()
    w2, b2 = w.detach().requires_grad_(), b.detach().requires_grad_()
    y = torch.nn.functional.linear(x2, w2, b2)
    ref = (y, *torch.autograd.grad(y, (x2, w2, b2), g))
    for a, r in zip(got, ref):
        assert a.shape == r.shape and a.dtype == r.dtype
        torch.testing.assert_close(a.float(), r.float(), atol=0.05, rtol=0.02)


def test_bf16_hands_the_tied_projection_its_loss_gradient_in_fp32():
    """The tied pre-softmax projection is the embedding's fp32 table, which bf16 training leaves
    as it is: the loss casts it itself and returns its gradient, scaled as the trainer scales the
    loss (1 / tokens), in fp32; a bf16 cast's gradient would be rounded to bf16. Rows of tokens
    absent from the batch get the loss's gradient alone."""
    model = _model()
    net, _ = precision.for_training(model, "bf16", torch.device("cpu"))
    src, tgt_in, tgt_out = (t[:2] for t in _batch())
    present = set(torch.cat([src.flatten(), tgt_in.flatten(), tgt_out.flatten()]).tolist())
    absent = sorted(set(range(4, 40)) - present)

    def grad(module):
        model.zero_grad()
        (module(src, tgt_in, tgt_out, 0.1)[0] / tgt_out.numel()).backward()
        return model.tgt_embed.weight.grad[absent]

    g, ref = grad(net), grad(model)
    assert g.dtype == torch.float32 and len(absent) > 10
    assert (g != g.bfloat16().float()).float().mean() > 0.5  # more bits than bf16 holds
    assert torch.allclose(g, ref, rtol=0.05, atol=0.05 * ref.abs().max().item())


def test_bf16_gradients_summed_over_many_positions_do_not_stall():
    """One token 3,000 times: its embedding row and the LayerNorm biases sum 3,000 gradients,
    which bf16 accumulation would stop adding up long before the end."""
    model = _model()
    net, _ = precision.for_training(model, "bf16", torch.device("cpu"))
    src = torch.full((60, 50), 7)
    tgt = torch.full((60, 50), 9)

    def grads(module):
        model.zero_grad()
        module(src, tgt, tgt, 0.1)[0].backward()
        return model.tgt_embed.weight.grad[[7, 9]].clone(), model.encoder[
            0
        ].res1.norm.bias.grad.clone()

    (emb_low, ln_low), (emb_full, ln_full) = grads(net), grads(model)
    assert torch.allclose(emb_low, emb_full, rtol=0.05, atol=0.05 * emb_full.abs().max().item())
    assert torch.allclose(ln_low, ln_full, rtol=0.05, atol=0.05 * ln_full.abs().max().item())


def test_importing_s2s_sets_the_cpu_runtime_defaults_before_torch_and_the_environment_wins():
    env = {k: v for k, v in os.environ.items() if k not in RUNTIME_ENV}
    env["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = "8"
    code = (
        "import os, json, sys, s2s.core; print(json.dumps([{k: os.environ.get(k) for k in s2s.core.RUNTIME_ENV},"
        " 'torch' in sys.modules]))"
    )
    seen, torch_loaded = json.loads(
        subprocess.run(
            [sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True
        ).stdout
    )
    assert seen == {
        "GOMP_SPINCOUNT": "1000",
        "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "8",
        "LRU_CACHE_CAPACITY": "1",
    }
    assert not torch_loaded  # so that they still take effect when torch loads


_HEAP_PROBE = """
import ctypes, json, s2s.core

names = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"


class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in names.split()]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype, libc.malloc.restype = Info, ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
block = libc.malloc(16 << 20)  # an update's tensor of 16 MiB
mapped = libc.mallinfo2().hblkhd
libc.free(block)
print(json.dumps([s2s.core.MALLOC_SET, mapped, libc.mallinfo2().arena]))
"""


@pytest.mark.skipif(
    not hasattr(ctypes.CDLL(None), "mallinfo2"), reason="glibc's malloc only (mallinfo2)"
)
def test_importing_s2s_keeps_freed_memory_in_glibcs_heap_and_the_environment_wins():
    """After `import s2s`, a 16 MiB block comes from glibc's heap, not a mapping of its own
    (which would fault fresh pages in at every use), and once freed the heap keeps its pages for
    the next; a MALLOC_* variable set at the process's start is glibc's to apply."""
    env = {k: v for k, v in os.environ.items() if k not in MALLOC_SETTINGS}

    def probe(**extra):
        out = subprocess.run(
            [sys.executable, "-c", _HEAP_PROBE],
            env={**env, **extra},
            check=True,
            capture_output=True,
            text=True,
        )
        return json.loads(out.stdout)

    names, mapped, heap = probe()
    assert names == ["MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"]
    assert mapped < 16 << 20 and heap >= 16 << 20
    names, mapped, heap = probe(MALLOC_MMAP_THRESHOLD_="131072", MALLOC_TRIM_THRESHOLD_="131072")
    assert names == []
    assert mapped >= 16 << 20 and heap < 16 << 20  # glibc's own settings: mapped, then handed back


def test_int8_search_off_the_cpu_is_one_config_error_naming_the_device():
    """Dynamic int8 quantisation runs on CPU only: a model elsewhere is a ConfigError (the CLI's
    one line), not an internal error. A model on the meta device stands in for a GPU's."""
    from s2s.core.errors import ConfigError

    with pytest.raises(ConfigError, match="int8 runs on CPU only.*meta.*decode.precision=bf16"):
        precision.for_inference(torch.nn.Linear(4, 4, device="meta"), "int8")


def test_the_last_level_cache_is_the_highest_level_sysfs_lists(tmp_path):
    """The cache size the search's attention compares its reads with: the highest level of a
    sysfs cache listing (sizes in K or M; an unreadable entry skipped), 32 MiB where there is
    no listing."""

    def listing(name, *caches):
        for i, (level, size) in enumerate(caches):
            (tmp_path / name / f"index{i}").mkdir(parents=True)
            (tmp_path / name / f"index{i}" / "level").write_text(f"{level}\n")
            (tmp_path / name / f"index{i}" / "size").write_text(f"{size}\n")
        (tmp_path / name / "index9").mkdir()  # neither level nor size: skipped
        return tmp_path / name

    amd = listing("amd", (1, "48K"), (3, "32M"), (2, "1024K"))
    intel = listing("intel", (1, "48K"), (2, "2048K"), (3, "98304K"))
    assert precision.cpu_last_level_cache(amd) == 32 * 2**20
    assert precision.cpu_last_level_cache(intel) == 96 * 2**20
    assert precision.cpu_last_level_cache(tmp_path / "absent") == 32 * 2**20
    assert precision.cpu_last_level_cache() >= 2**20  # this machine's
