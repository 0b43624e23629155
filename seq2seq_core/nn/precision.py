"""Arithmetic precision: which one a run computes in, and running the model in it.

Training (`run.precision`):
* fp32: everything in float32.
* bf16: mixed precision with fp32 master weights. The parameters, Adam's moments and the loss
  stay fp32; `LowPrecision` casts the floating parameters and buffers to bfloat16 once per
  forward pass and runs the forward and backward passes in bfloat16 without autocast (no
  per-operation casts). The casts' backward turns each bf16 gradient into fp32 and accumulates
  it into the fp32 parameter, where DDP all-reduces it and the optimiser reads it. Embedding
  look-ups and LayerNorm compute from fp32 tensors (`LowPrecision` says why); the loss
  (`s2s.core.nn.loss.label_smoothed_loss`) multiplies the bf16 decoder states by the bf16 output
  weight a chunk of rows at a time and reduces each chunk in fp32 (a weight tied to the embedding
  is cast inside the loss, and its gradient summed and returned in fp32). On CPU bf16 attention is
  equation 1 written out in bf16 products (s2s.core.nn.model.attention), and dropout draws its mask
  in bf16. On CPU the linear layers and the loss pad their rows as search's do (`RowPaddedLinear`).
* fp16: autocast to float16 with dynamic loss scaling (fp16's narrow range needs both).
* auto: bf16 where the device computes bf16 natively (a CPU with avx512_bf16 or amx_bf16, a GPU
  from Ampere on: compute capability 8.0), fp16 on a Volta or Turing GPU (7.x: fp16 tensor
  cores, no bf16), else fp32.
Asking for bf16 where the device lacks it natively (a CPU without the flags, a GPU before sm_80,
which torch.cuda.is_bf16_supported() counts because it emulates bf16) falls back to fp32 with a
warning: emulated bf16 would be slower than fp32. On a GPU from Ampere on, fp32 matrix products
run in TF32 (fp32 range, 10-bit mantissa inputs, fp32 sums): `resolve` turns it on there.

Search (`decode.precision`), on a copy of the model made by `for_inference`:
* auto (the default): bf16 on a GPU from Ampere on and on a CPU with AMX, else fp32
  (`resolve_search`); docs/performance.md gives bf16's BLEU and F1 against fp32's.
* fp32: the model as trained; on a CPU its linear layers multiply with oneDNN and pad their
  rows (`padded_rows`; `RowPaddedLinear` says why).
* bf16: weights and activations in bfloat16; the search's scores stay fp32 (it takes the
  log-softmax of the logits in fp32). On CPU the linear layers are `RowPaddedLinear` too.
* int8: dynamic quantisation of every linear layer (torch.ao.quantization.quantize_dynamic:
  int8 weights, activations quantised per call from their range); embeddings, LayerNorm and
  attention stay fp32.
The search itself (s2s.core.decode.search) is the same exact search in every precision.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import platform
import warnings
from functools import lru_cache
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import ConfigError

log = logging.getLogger("s2s")


@lru_cache(maxsize=None)
def cpu_flags() -> frozenset:
    """This CPU's feature flags (/proc/cpuinfo's `flags` or `Features`); empty where unreadable."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    flags = set()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            flags.update(line.split(":", 1)[1].split())
    return frozenset(flags)


def cpu_has_bf16() -> bool:
    """True when this CPU multiplies bf16 natively (x86 avx512_bf16 or amx_bf16, Arm bf16)."""
    if not cpu_flags():
        return platform.system() == "Darwin" and platform.machine() == "arm64"  # Apple M2 and later
    return bool(cpu_flags() & {"avx512_bf16", "amx_bf16", "bf16"})


def cpu_has_bf16_matrix_units() -> bool:
    """True when this CPU multiplies bf16 matrices on matrix units (x86 amx_bf16)."""
    return "amx_bf16" in cpu_flags()


@lru_cache(maxsize=None)
def cpu_last_level_cache(caches: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int:
    """The bytes of this CPU's largest cache: the highest level that Linux lists in `caches`
    (sysfs, cpu0's; each indexN holds its `level` and a `size` such as "32768K"), 32 MiB where
    none is readable."""
    sizes = {}
    for index in caches.glob("index*"):
        try:
            level = int((index / "level").read_text())
            size = (index / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(size[-1:], 1)
        if size.rstrip("KMG").isdigit():
            sizes[level] = int(size.rstrip("KMG")) * scale
    return sizes[max(sizes)] if sizes else 32 * 2**20


AMPERE, VOLTA = (8, 0), (7, 0)  # compute capabilities: native bf16 and TF32; fp16 tensor cores


def cuda_capability(device: torch.device) -> tuple[int, int]:
    """The compute capability of a CUDA device, (major, minor): (8, 0) for an A100."""
    return tuple(torch.cuda.get_device_capability(device))


def device_has_bf16(device: torch.device) -> bool:
    if device.type == "cuda":
        return cuda_capability(device) >= AMPERE
    return device.type == "cpu" and cpu_has_bf16()


def resolve(precision: str, device: torch.device, setting: str = "run.precision") -> str:
    """The precision to compute in: `auto` decided for this device, and bf16 where the device
    lacks it replaced by fp32 (with a warning naming the setting). On a CUDA device from
    Ampere on, fp32 matrix products are set to TF32 (`torch.backends.cuda.matmul.allow_tf32`)."""
    precision = getattr(precision, "value", precision)  # the config's enum, or a plain string
    device = torch.device(device)
    if device.type == "cuda" and cuda_capability(device) >= AMPERE:
        torch.backends.cuda.matmul.allow_tf32 = True  # TF32 for the fp32 products (CUDA only)
        torch.backends.cudnn.allow_tf32 = True
    if precision == "auto":
        if device_has_bf16(device):
            return "bf16"
        return "fp16" if device.type == "cuda" and cuda_capability(device) >= VOLTA else "fp32"
    if precision == "bf16" and not device_has_bf16(device):
        log.warning(
            "%s=bf16: this %s has no native bf16 arithmetic, computing in fp32 instead%s",
            setting,
            device.type.upper(),
            " (fp16 uses its tensor cores)" if device.type == "cuda" else "",
        )
        return "fp32"
    return precision


def resolve_search(precision: str, device: torch.device) -> str:
    """The precision a search runs in (`decode.precision`): auto is bf16 on a GPU from Ampere on
    and on a CPU with bf16 matrix units (AMX), fp32 elsewhere (never fp16: search has no fp16
    model); the other values as `resolve` decides them. A CPU with avx512_bf16 alone trains in
    bf16 but searches in fp32 by default: there bf16 search lost quality and, at beam 21, speed
    (docs/performance.md)."""
    precision = getattr(precision, "value", precision)
    device = torch.device(device)
    if precision == "auto":
        native = device_has_bf16(device) and (device.type != "cpu" or cpu_has_bf16_matrix_units())
        return "bf16" if native else "fp32"
    return resolve(precision, device, "decode.precision")


class LowPrecision(nn.Module):
    """Runs `module` with its floating parameters and buffers cast to `dtype`, once per call.

    The casts are part of the autograd graph: the backward pass computes in `dtype` and the
    gradients arrive, in the parameters' own dtype, in the parameters' .grad. A tensor that
    several modules share is cast once. Embeddings and LayerNorms keep their fp32 tensors: their
    backward passes sum a gradient over every position (each occurrence of a token; each
    position's gain and bias), which in bf16 stalls, so the embedding look-up reads the fp32
    table and returns bf16 rows (s2s.core.nn.model.Transformer.embed), and LayerNorm computes in
    fp32 (s2s.core.nn.model.LayerNorm). The tied pre-softmax projection still multiplies in bf16.
    """

    KEEP_FP32 = (nn.Embedding, nn.LayerNorm)

    def __init__(self, module: nn.Module, dtype: torch.dtype = torch.bfloat16):
        super().__init__()
        self.module, self.dtype = module, dtype

    @contextlib.contextmanager
    def cast(self):
        """Within: every module's floating tensors are their casts; afterwards the originals.
        (torch.func.functional_call leaves a module registered under two names untied.)"""
        swapped, casts = [], {}
        for m in self.module.modules():  # each module once, however many names it has
            if isinstance(m, self.KEEP_FP32):
                continue
            for store in (m._parameters, m._buffers):
                for name, t in store.items():
                    if t is not None and t.is_floating_point() and t.dtype != self.dtype:
                        swapped.append((store, name, t))
                        store[name] = casts.setdefault(id(t), t.to(self.dtype))
        try:
            yield
        finally:
            for store, name, t in swapped:
                store[name] = t

    def forward(self, *args, **kwargs):
        with self.cast():
            return self.module(*args, **kwargs)


def for_training(model: nn.Module, precision: str, device: torch.device):
    """(the module to call, a context factory to call it in) for a resolved training precision."""
    if precision == "bf16":
        if device.type == "cpu":
            row_padded(model)
        return LowPrecision(model, torch.bfloat16), contextlib.nullcontext
    if precision == "fp16":
        return model, lambda: torch.autocast(device_type=device.type, dtype=torch.float16)
    return model, contextlib.nullcontext


@lru_cache(maxsize=None)
def onednn_linear() -> bool:
    """Whether this torch has oneDNN's linear operator for dense CPU tensors (the one
    torch.compile's CPU backend calls)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def padded_rows(rows: int) -> int:
    """rows rounded up to a multiple of RowPaddedLinear.ROWS, or of 1/16 of the power of two at
    or below it where that is more (1,024 to 2,047 rows: 64; 2,048 to 4,095: 128): at most 1/16
    more rows, 16 row counts a doubling."""
    step = max(RowPaddedLinear.ROWS, 2 ** (rows.bit_length() - 5))
    return -(-rows // step) * step


class RowPaddedLinear(nn.Linear):
    """nn.Linear whose product on a CPU is oneDNN's, its input rows padded with zeros
    (`padded_rows`) and the padding's outputs dropped: in search without a gradient (fp32 and
    bf16), and in bf16 training. Each row's output is the layer's own, in its dtype.

    oneDNN: torch multiplies fp32 with MKL, whose kernels on some CPUs do not use their whole
    vector width (AMD's with AVX-512: docs/performance.md, "Search"), while oneDNN's do; bf16
    products are oneDNN's anyway. oneDNN computes each product with a kernel compiled for its
    exact shape, which takes longer than the product itself, and keeps only the last
    ONEDNN_PRIMITIVE_CACHE_CAPACITY of them (s2s.core.RUNTIME_ENV). A search's row count (its
    live hypotheses) changes at almost every step as sentences finish, and a training batch's
    token count at every update, so nearly every product would compile anew; padded, a batch of
    128 sentences at beam 4 has 16 row counts, and training batches of 1,024 to 4,095 tokens 33,
    whose kernels stay cached from one step or update to the next. In training the padding
    reaches the backward pass: the output's gradient is padded with zeros too (the slice's
    backward), so the weight's gradient, a product over the rows, has a padded shape as well
    and its zero rows add nothing. The padding rows cost little: a product of a few rows is
    bound by reading the weights, and at most 1/16 more rows add at most 1/16 more work."""

    ROWS = 32

    def forward(self, x: Tensor) -> Tensor:
        grad = torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)
        if x.device.type != "cpu" or (grad and x.dtype == torch.float32):
            return super().forward(x)
        rows = x.shape[:-1].numel()
        padded = padded_rows(rows)
        flat = x.reshape(rows, -1)
        if padded != rows:  # the rows, then zeros
            flat = F.pad(flat, (0, 0, 0, padded - rows))
        if x.dtype == torch.float32 and onednn_linear():
            y = torch.ops.mkldnn._linear_pointwise(flat, self.weight, self.bias, "none", [], "")
        else:
            y = F.linear(flat, self.weight, self.bias)
        return y[:rows].view(*x.shape[:-1], -1)


def row_padded(model: nn.Module) -> nn.Module:
    """model with each nn.Linear a RowPaddedLinear (the same weights)."""
    for m in model.modules():
        if type(m) is nn.Linear:
            m.__class__ = RowPaddedLinear
    return model


def for_inference(model: nn.Module, precision: str) -> nn.Module:
    """The model to search with in a resolved decode precision: a converted copy in eval mode
    (the trained model is left as it is), or for fp32 on a GPU the model itself. A model this
    made is converted again from its plain linear layers."""
    device = next(model.parameters()).device
    if precision == "fp32" and device.type != "cpu":
        return model
    searched = copy.deepcopy(model).eval()
    for m in searched.modules():
        if type(m) is RowPaddedLinear:
            m.__class__ = nn.Linear
    if precision == "fp32":
        return row_padded(searched)
    if precision == "bf16":
        searched = searched.to(torch.bfloat16)
        return row_padded(searched) if device.type == "cpu" else searched
    if precision == "int8":
        if device.type != "cpu":
            raise ConfigError(
                "decode.precision=int8 runs on CPU only (dynamic quantisation), and this model is "
                f"on {device}: use decode.precision=bf16 on a GPU"
            )
        with (
            warnings.catch_warnings()
        ):  # torch 2.10+ points to torchao for this; it still works, on fbgemm
            warnings.simplefilter("ignore")
            return torch.ao.quantization.quantize_dynamic(searched, {nn.Linear}, dtype=torch.qint8)
    raise ValueError(f"unknown decode precision {precision!r}")
