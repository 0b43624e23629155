"""The settings of a run: one dataclass per component, each field with its default and the values it
allows (`s2s.core.contract.checks`). `s2s.core.setup.config` loads them from a preset and the
command line."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, List, Optional

from ..contract.checks import (
    NOT_EMPTY,
    PROBABILITY,
    SEED_MAX,
    Allowed,
    above,
    at_least,
    in_range,
    one_of,
    setting,
    setting_list,
)
from ..errors import ConfigError

CLEAN_RULES = ("empty", "same", "duplicate")  # s2s.core.data.cleaning
_DEVICE = re.compile(r"auto|cpu|mps|cuda(:\d+)?")


@dataclass
class ModelConfig:
    """The Transformer of section 3: N layers in each stack, d_model, d_ff, h heads, P_drop."""

    layers: int = setting(6, at_least(1))
    # a stack's own depth (None: `layers`): a deep encoder with a shallow decoder decodes faster
    # at the same quality (Kasai et al. 2021), OPUS-MT's students are 6 + 2
    encoder_layers: Optional[int] = setting(None, at_least(1))
    decoder_layers: Optional[int] = setting(None, at_least(1))
    d_model: int = setting(512, at_least(1))
    d_ff: int = setting(2048, at_least(1))
    heads: int = setting(8, at_least(1))
    # dimensions of a head's queries and keys (d_k) and values (d_v); None = d_model / heads (Table
    # 3, A, B)
    d_k: Optional[int] = setting(None, at_least(1))
    d_v: Optional[int] = setting(None, at_least(1))
    dropout: float = setting(0.1, PROBABILITY)
    attention_dropout: float = setting(0.0, PROBABILITY)
    pre_norm: bool = False  # the paper is post-norm: LayerNorm(x + Dropout(Sublayer(x)))
    # the pre-softmax projection is the target embedding: None = only with a shared vocabulary
    # (section 3.4 ties all three); a small separate target vocabulary learns a little faster untied
    tie_output: Optional[bool] = None
    max_positions: int = setting(1024, at_least(2))
    # section 3.5, learned (Table 3, E), or offset_sinusoid: fairseq's and M2M100 / NLLB's table
    # ([sin | cos] halves, frequencies 10000^(-i / (d/2 - 1))), its rows from the padding index + 1
    positions: str = setting("sinusoid", one_of("sinusoid", "learned", "offset_sinusoid"))
    # embeddings multiplied by sqrt(d_model) (section 3.4); M2M100's scale_embedding=false does not
    scale_embedding: bool = True
    # the feed-forward network's activation: the paper's ReLU, or swish (x sigmoid(x), OPUS-MT's)
    activation: str = setting("relu", one_of("relu", "swish"))
    # a bias on the pre-softmax projection (OPUS-MT's final logits bias); -inf marks an id the
    # model never writes (an imported vocabulary's extra row)
    output_bias: bool = False
    # the output bias held as it was set, never trained: an import's (transformers keeps Marian's
    # final_logits_bias as a buffer; M2M100 / NLLB and fairseq have none, s2s's only marks BOS),
    # so a fine-tune of it still has the form of its own class to export back into
    output_bias_fixed: bool = False

    @staticmethod
    def check_relations(m, where: str) -> None:
        if m.get("output_bias_fixed") and not m.get("output_bias"):
            raise ConfigError(
                f"{where}.output_bias_fixed=true holds a bias the model does not have: set "
                f"{where}.output_bias=true, or drop output_bias_fixed"
            )
        if m.d_model % 2:
            raise ConfigError(
                f"{where}.d_model={m.d_model}: must be an even number (the sinusoidal positions "
                f"pair a sine and a cosine per frequency), e.g. {m.d_model + 1}"
            )
        if m.d_model % m.heads and (
            m.get("d_k") is None or m.get("d_v") is None
        ):  # d_model / h is a default
            divisors = [h for h in range(1, min(m.d_model, 64) + 1) if m.d_model % h == 0]
            raise ConfigError(
                f"{where}.heads={m.heads}: must divide {where}.d_model={m.d_model} "
                "(d_k = d_model / h unless model.d_k and model.d_v are set), e.g. "
                f"{', '.join(map(str, divisors[-4:]))}"
            )


@dataclass
class OptimConfig:
    """Adam and the warm-up schedule of section 5.3, label smoothing of 5.4.

    lrate = lr_scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)
    """

    lr_scale: float = setting(1.0, above(0))
    warmup: int = setting(4000, at_least(1))
    beta1: float = setting(0.9, PROBABILITY)
    beta2: float = setting(0.98, PROBABILITY)
    eps: float = setting(1e-9, above(0))
    weight_decay: float = setting(0.0, at_least(0))
    clip_norm: float = setting(
        0.0, at_least(0, "0 = no clipping")
    )  # 0 = no clipping, as in the paper
    label_smoothing: float = setting(0.1, PROBABILITY)
    max_updates: int = setting(100_000, at_least(1))
    update_freq: int = setting(1, at_least(1))  # gradient accumulation: batches per update


@dataclass
class DataConfig:
    """Token-count batching: a batch holds about max_tokens source and max_tokens target tokens."""

    max_tokens: int = setting(25_000, at_least(1))
    max_len: int = setting(
        1024, at_least(1)
    )  # pairs with a longer side (in tokens) are dropped from training
    max_len_ratio: float = setting(
        0.0, Allowed(lambda v: v == 0 or v >= 1, "0 (no ratio filter) or a number >= 1")
    )  # 0 = no ratio filter; otherwise drop pairs with len ratio above it
    cache_dir: str = setting(
        ".cache/s2s", NOT_EMPTY, path=True
    )  # prepared data, keyed by the task section
    # the training split is cut into shards of this many pairs, binarised by `workers` processes
    # (0: one per core this process may use); a shard whose pairs did not change is kept when
    # the corpus grows or changes (s2s.core.data.shards)
    shard_pairs: int = setting(1_000_000, at_least(1000))
    workers: int = setting(0, at_least(0))
    # the vocabulary is trained on the first vocab_sample training pairs (0: on all of them)
    vocab_sample: int = setting(1_000_000, at_least(0))
    # noise on training sources, drawn from (run.seed, epoch, pair) (s2s.core.data.augment):
    # the probability a source is upper- or lower-cased, loses its punctuation, and a word of
    # it gets a typo
    augment_case: float = setting(0.0, in_range(0, 1, "a probability"))
    augment_punct: float = setting(0.0, in_range(0, 1, "a probability"))
    augment_typos: float = setting(0.0, in_range(0, 1, "a probability"))
    # cleaning rules for the training pairs besides max_len and max_len_ratio, each counted
    # (s2s.core.data.cleaning): empty (a side empty), same (source == target), duplicate (a pair
    # seen before, in its shard or an earlier one)
    clean: List[str] = setting_list(
        Allowed(
            lambda v: set(v) <= set(CLEAN_RULES),
            f"a list of {', '.join(CLEAN_RULES)} (e.g. [empty,same,duplicate])",
        )
    )


class Stop(str, Enum):
    """Beam search's stopping rule (s2s.core.contract.task.DecodeDefaults says what each means)."""

    bound = "bound"
    beam = "beam"
    transformers = "transformers"

    def __str__(self) -> str:
        return self.value


class LengthPenalty(str, Enum):
    """The length penalty's form (s2s.core.decode.steps.length_penalty)."""

    gnmt = "gnmt"
    power = "power"

    def __str__(self) -> str:
        return self.value


class SearchPrecision(str, Enum):
    """The model search runs with (s2s.core.nn.precision.for_inference): fp32, bf16, dynamic
    int8 linear layers (CPU), or auto: bf16 where the device computes bf16 natively, else fp32."""

    fp32 = "fp32"
    bf16 = "bf16"
    int8 = "int8"
    auto = "auto"

    def __str__(self) -> str:
        return self.value


@dataclass
class DecodeConfig:
    """Decoding; None means the task's default."""

    beam: Optional[int] = setting(None, at_least(1))
    # bounded where a search's arithmetic is: lp(Y) stays finite in float32, and a * |x| + b in
    # int64 (a longer limit is the model's positions anyway)
    alpha: Optional[float] = setting(None, in_range(0, 10))
    max_len_a: Optional[float] = setting(None, in_range(0, 10_000))
    max_len_b: Optional[int] = setting(None, in_range(0, 10**9, "a whole number"))
    # the fewest tokens an output has before </s> (fairseq's --min-len, 1 there)
    min_len: Optional[int] = setting(None, in_range(0, 10**9, "a whole number"))
    # when beam search leaves a sentence: bound (exact), beam (fairseq's) or transformers (the
    # `generate` of Hugging Face transformers, early_stopping=False)
    stop: Optional[Stop] = None
    # the length penalty's form: gnmt ((5 + |Y|) / 6)^alpha, or power |Y|^alpha (fairseq's
    # lenpen, Marian's normalisation, transformers' length_penalty)
    length_penalty: Optional[LengthPenalty] = None
    max_sentences: int = setting(
        0, at_least(0, "0 = by device: 128 on a CPU, 1,024 on a GPU")
    )  # sentences decoded together
    #: the model searched with: auto (bf16 where native, else fp32) | fp32 | bf16 | int8 (CPU)
    precision: SearchPrecision = SearchPrecision.auto
    # a multilingual model's languages (NLLB-200's eng_Latn, M2M100's de; "" = the import's):
    # the source's code starts the source, the target's is forced as the output's first token
    src_lang: str = ""
    tgt_lang: str = ""


class Precision(str, Enum):
    """Arithmetic of training (s2s.core.nn.precision says what each means): fp32, bf16 with fp32
    master weights, fp16 autocast with dynamic loss scaling, or auto (bf16 where the device has
    it natively, else fp32); any other value fails when the config is loaded."""

    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"
    auto = "auto"

    def __str__(self) -> str:
        return self.value


INIT_KEEP = ("optimizer", "schedule", "best", "data")

#: multi-task sampling, p_k ~ weight_k * n_k^(1/T) in float64 (s2s.core.training.schedule): with n_k
#: up to 10^12 pairs, 1/T * ln(10^12) + ln(weight) stays far below ln(float64 max) ~ 709.8
MIN_TEMPERATURE = 0.05
WEIGHT_RANGE = (1e-6, 1e6)


@dataclass
class RunConfig:
    """Where and how a run happens, and how often it validates, logs and saves."""

    dir: str = setting("runs/default", NOT_EMPTY, path=True)
    seed: int = setting(
        1, in_range(0, SEED_MAX, "a whole number")
    )  # numpy's and torch's seed range
    device: str = setting(
        "auto", Allowed(lambda v: bool(_DEVICE.fullmatch(str(v))), "auto, cpu, mps, cuda or cuda:N")
    )  # auto | cpu | cuda | cuda:N
    threads: int = setting(
        0, at_least(0, "0 = torch's default")
    )  # torch intra-op threads on CPU; 0 = torch's default
    precision: Precision = Precision.fp32  # fp32 | bf16 | fp16 | auto; fp32 unless you ask
    log_interval: int = setting(100, at_least(1))
    valid_interval: int = setting(
        1000, at_least(1)
    )  # updates between validations (loss and task metric; the best model is kept)
    # no validation before this update (fairseq's --validate-after-updates); the last update
    # always validates
    valid_after: int = setting(0, at_least(0))
    valid_max_sentences: int = setting(
        0, at_least(0, "0 = all")
    )  # decode at most this many dev sentences for the metric (0 = all)
    valid_beam: int = setting(
        0, at_least(0, "0 = the task's beam")
    )  # dev search's beam for the metric, at most the task's (0 = the task's)
    # early stopping: stop after this many validations in a row without a better selection
    # figure than the best so far, better in the direction the task's Score declares (0 = off)
    patience: int = setting(0, at_least(0, "0 = off"))
    save_interval: int = setting(1000, at_least(1))  # updates between checkpoints
    # also stop after this many minutes of training, across resumes (0 = off): updates, validation
    # and checkpoints count; data preparation and what follows the budget (averaging, the chosen
    # model's dev re-score, the test decode) do not, and the log says when the budget ran out
    max_minutes: float = setting(0.0, at_least(0, "0 = off"))
    save_minutes: float = setting(
        0.0, at_least(0, "0 = off")
    )  # also save when this many minutes passed since the last save (0 = off)
    keep_last: int = setting(5, at_least(1))  # checkpoints kept
    average_last: int = setting(
        0,
        at_least(0, "0 = none"),
        # at the end, average the last K checkpoints (0 = none); tested unless the best
        # validated model scores better on dev
    )
    max_nonfinite: int = setting(
        10, at_least(1)
    )  # stop after this many non-finite updates in a row
    # several processes (s2s.core.runs.distributed): a collective of training fails after
    # timeout_minutes (a process that hangs stops the run); waiting for what rank 0 does alone
    # (first data preparation, the test decode, averaging checkpoints) fails only after wait_minutes
    timeout_minutes: float = setting(10.0, above(0))
    wait_minutes: float = setting(720.0, above(0))
    # a new run starts from the weights of this run directory (the checkpoint it tested) or
    # checkpoint file (s2s.core.training.transfer); "" = from scratch. init_member: the source
    # member whose vocabulary rows to take, from a multi-task source; init_keep: what else to take
    # besides the weights (optimizer, schedule, best, data), nothing by default
    init_from: str = setting("", path=True)
    init_member: str = ""
    init_keep: List[str] = setting_list(
        Allowed(
            lambda v: set(v) <= set(INIT_KEEP),
            f"a list of {', '.join(INIT_KEEP)} (e.g. [optimizer,schedule])",
        )
    )
    quiet: bool = False

    @staticmethod
    def check_relations(r, where: str) -> None:
        if r.average_last > r.keep_last:
            raise ConfigError(
                f"{where}.average_last={r.average_last}: must be <= "
                f"{where}.keep_last={r.keep_last} (only the kept checkpoints can be averaged)"
            )
        _check_device(str(r.device))
        if not r.init_from and (r.init_member or list(r.init_keep)):
            given = "init_member" if r.init_member else "init_keep"
            raise ConfigError(
                f"{where}.{given} is set but {where}.init_from is not: they choose what to take "
                f"from the run {where}.init_from names (set it, or leave {where}.{given} out)"
            )


@dataclass
class MultitaskConfig:
    """Several tasks in one model (`tasks`, see s2s.core.data.members): update u trains one member,
    drawn with probability proportional to weight * (training pairs)^(1/temperature)."""

    temperature: float = setting(
        1.0, above(0)
    )  # 1: in proportion to size; larger: closer to uniform
    # members whose tasks declare the same tokenizer kind and a common language on a side share
    # one vocabulary there, trained jointly (s2s.core.data.joint); source and target are then one
    # space with every embedding tied (section 3.4)
    shared_vocab: bool = False
    # the joint vocabulary's text: member k's lines sampled in proportion to n_k^(1/T)
    # (Arivazhagan et al. 2019), so that a small member does not vanish from it
    vocab_temperature: float = setting(5.0, above(0))
    # a curriculum: the updates at which stage 1, 2, ... begins (ascending); in stage s > 0 a
    # member is drawn with its `stage_weights[s - 1]` instead of its `weight` (docs/multitask.md)
    stages: List[int] = setting_list(
        Allowed(
            lambda v: all(isinstance(x, int) and x >= 1 for x in v) and list(v) == sorted(set(v)),
            "ascending update numbers >= 1, e.g. [2000,8000]",
        )
    )


@dataclass
class MemberConfig:
    """One member of a multi-task preset: a task section, or a single-task preset whose task
    section it takes (with `task` keys overriding it), a sampling weight and the weight of its
    metric in the selection figure (the weighted mean of the members' primary figures)."""

    preset: str = ""
    task: Any = field(default_factory=dict)
    weight: float = setting(1.0, above(0))
    select: float = setting(1.0, at_least(0))
    # its weight in each stage after the first (multitask.stages); 0: not drawn in that stage
    stage_weights: List[float] = setting_list(
        Allowed(lambda v: all(0 <= x <= WEIGHT_RANGE[1] for x in v), "weights >= 0")
    )

    @staticmethod
    def check_relations(member, where: str) -> None:
        for key, (lo, hi) in (("weight", WEIGHT_RANGE), ("select", (0, WEIGHT_RANGE[1]))):
            if not lo <= member[key] <= hi:
                raise ConfigError(
                    f"{where}.{key}={member[key]!r}: must be in [{lo:g}, {hi:g}] (weights "
                    "are relative: beyond that the sampling probabilities overflow)"
                )


@dataclass
class Config:
    task: Any = field(default_factory=dict)
    tasks: Any = None  # multi-task: member name -> MemberConfig (then no `task` section)
    multitask: MultitaskConfig = field(default_factory=MultitaskConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    data: DataConfig = field(default_factory=DataConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    run: RunConfig = field(default_factory=RunConfig)
    # where an imported run's weights came from (`s2s import`: the format, the source, its
    # revision, each file read and its SHA-256); None for a run s2s trained
    origin: Any = None

    @staticmethod
    def check_relations(cfg, where: str) -> None:
        """What ties one section to another."""
        if cfg.data.max_len > cfg.model.max_positions:
            raise ConfigError(
                f"data.max_len={cfg.data.max_len}: must be <= model.max_positions="
                f"{cfg.model.max_positions} (a longer training pair would not fit the model's "
                "positions)"
            )
        stages = list(cfg.multitask.stages)
        if stages and cfg.tasks is None:
            raise ConfigError(
                f"multitask.stages={stages}: stages mix the members of `tasks`; this run has "
                "one task"
            )
        for name, member in (cfg.tasks or {}).items():
            if len(member.stage_weights) != len(stages):
                raise ConfigError(
                    f"tasks.{name}.stage_weights={list(member.stage_weights)}: one weight for each "
                    f"stage after the first, {len(stages)} (multitask.stages={stages})"
                )
        for s in range(len(stages)):
            if cfg.tasks is not None and not any(
                m.stage_weights[s] > 0 for m in cfg.tasks.values()
            ):
                raise ConfigError(
                    f"multitask.stages: stage {s + 1} (from update {stages[s]}) gives every "
                    "member weight 0 (tasks.NAME.stage_weights)"
                )
        for key in ("temperature", "vocab_temperature"):
            if cfg.tasks is not None and cfg.multitask[key] < MIN_TEMPERATURE:
                raise ConfigError(
                    f"multitask.{key}={cfg.multitask[key]!r}: must be >= {MIN_TEMPERATURE} "
                    f"(a member's n^(1/{key}) overflows below that)"
                )


#: the engine's sections, each checked against its dataclass's declared ranges
SECTIONS = {
    "model": ModelConfig,
    "optim": OptimConfig,
    "data": DataConfig,
    "decode": DecodeConfig,
    "run": RunConfig,
    "multitask": MultitaskConfig,
}


def _check_device(device: str) -> None:
    """run.device names a device this build of torch has (torch is imported only to ask)."""
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            why = (
                "this torch build has no CUDA"
                if torch.version.cuda is None
                else "torch sees no CUDA device"
            )
            raise ConfigError(f"run.device={device!r}: {why}; use run.device=cpu (or auto)")
        index = int(device.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise ConfigError(
                f"run.device={device!r}: there are {torch.cuda.device_count()} CUDA devices "
                f"(cuda:0 .. cuda:{torch.cuda.device_count() - 1})"
            )
    elif device == "mps":
        import torch

        if not torch.backends.mps.is_available():
            raise ConfigError(
                f"run.device={device!r}: this machine or torch build has no MPS device; "
                "use run.device=cpu (or auto)"
            )
