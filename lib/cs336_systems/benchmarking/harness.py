"""End-to-end timing of the Transformer LM: forward, forward+backward, or a full AdamW step.

The rules of the handout, made habits: `warmup` untimed steps, then `steps` timed ones, each
followed by a device synchronize and timed with `timeit.default_timer`; mean and standard
deviation reported; every step wrapped in named ranges (warm-up vs measured, forward, backward,
optimizer step) that torch.profiler and `nsys profile` both see.
"""

from __future__ import annotations

import contextlib
import gc
import statistics
import timeit
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from cs336_systems.model import MODEL_SIZES, ModelConfig, TransformerLM, count_parameters, cross_entropy
from cs336_systems.optim import OPTIMIZERS, make_optimizer
from cs336_systems.profiling.ranges import annotated

MODES = ("forward", "forward-backward", "train-step")
PRECISIONS = ("fp32", "bf16")
COMPILE_SCOPES = ("model", "blocks")


@dataclass
class BenchmarkConfig:
    """One benchmark: a model (a size name, or hyperparameters in `model`), a batch, a mode."""

    size: str | None = "small"
    context_length: int = 256
    batch_size: int = 4
    mode: str = "forward-backward"
    precision: str = "fp32"
    warmup: int = 5
    steps: int = 10
    compile: bool = False
    compile_scope: str = "model"  # "model": torch.compile(model); "blocks": each repeated block (compile_fresh)
    attention: str = "naive"
    checkpoint_every: int | None = None
    optimizer: str = "adamw"  # train-step only: one of cs336_systems.optim.OPTIMIZERS
    model_context_length: int | None = None  # the model's maximum; defaults to context_length
    model: dict = field(default_factory=dict)  # d_model, d_ff, num_layers, num_heads, vocab_size overrides
    device: str | None = None  # None: cuda if available, else cpu
    seed: int = 0

    def resolved_device(self) -> torch.device:
        return torch.device(self.device or ("cuda" if torch.cuda.is_available() else "cpu"))

    def model_config(self) -> ModelConfig:
        ctx = self.model_context_length or self.context_length
        if self.size is None:
            return ModelConfig(context_length=ctx, **self.model)
        return ModelConfig.from_size(self.size, context_length=ctx, **self.model)

    def validate(self) -> None:
        if self.size is not None and self.size not in MODEL_SIZES:
            raise ValueError(f"unknown model size {self.size!r}; known sizes: {', '.join(MODEL_SIZES)}")
        if self.mode not in MODES:
            raise ValueError(f"unknown mode {self.mode!r}; choose one of {', '.join(MODES)}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {self.optimizer!r}; choose one of {', '.join(OPTIMIZERS)}")
        if self.compile_scope not in COMPILE_SCOPES:
            raise ValueError(f"unknown compile scope {self.compile_scope!r}; choose one of {', '.join(COMPILE_SCOPES)}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"unknown precision {self.precision!r}; choose one of {', '.join(PRECISIONS)}")
        model_ctx = self.model_context_length or self.context_length
        if self.context_length > model_ctx:
            raise ValueError(f"context length {self.context_length} is above the model's context_length {model_ctx}")
        if self.warmup < 0 or self.steps < 1:
            raise ValueError(f"need warmup >= 0 and steps >= 1, got warmup={self.warmup}, steps={self.steps}")
        if self.precision == "bf16" and not bf16_supported(self.resolved_device()):
            raise ValueError(f"bf16 was requested but device {self.resolved_device()} does not support bfloat16")

    def label(self) -> dict:
        d = asdict(self)
        d.pop("model")
        d.update({f"model_{k}": v for k, v in self.model.items()})
        return d


def bf16_supported(device: torch.device) -> bool:
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)
    return device.type == "cpu"


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def autocast_context(precision: str, device: torch.device):
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


@dataclass
class TrainingSetup:
    """The objects one benchmark steps through; `step()` runs one step of `config.mode`."""

    config: BenchmarkConfig
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer | None
    inputs: torch.Tensor
    targets: torch.Tensor
    device: torch.device
    num_parameters: int

    def step(self) -> None:
        mode = self.config.mode
        with autocast_context(self.config.precision, self.device):
            if mode == "forward":
                with torch.no_grad(), annotated("forward"):
                    self.model(self.inputs)
                return
            with annotated("forward"):
                loss = cross_entropy(self.model(self.inputs), self.targets)
        with annotated("backward"):
            loss.backward()
        if mode == "train-step":
            with annotated("optimizer step"):
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
        else:
            self.model.zero_grad(set_to_none=True)


def compile_fresh(model: torch.nn.Module, scope: str = "model") -> torch.nn.Module:
    """`torch.compile` from a clean Dynamo state, of the whole model or of each repeated block.

    The models of a sweep share one `forward` code object, and every size, context, precision or
    grad mode compiled earlier in the process is a cache entry of that frame. Past Dynamo's
    recompile limit (8) it stops compiling the frame and runs it eagerly, with one logged warning
    and nothing in the result to show it. Resetting first gives every configuration its own
    compilation (the on-disk Inductor caches still make repeats fast).

    scope="model" traces the whole model into one graph, whose size (and compile time) grows with
    the number of layers. scope="blocks" is PyTorch's regional compilation: each block of the
    model's repeated stack (`repeated_blocks`) is compiled in place; the blocks are instances of one
    class, so Dynamo compiles the first and reuses its code for the others, and the compile time is
    one block's whatever the depth. What stays eager is outside the stack (embedding, final norm,
    output head) and no fusion crosses a block boundary.
    """
    torch._dynamo.reset()
    if scope == "model":
        return torch.compile(model)
    if scope != "blocks":
        raise ValueError(f"unknown compile scope {scope!r}; choose one of {', '.join(COMPILE_SCOPES)}")
    for block in repeated_blocks(model):
        block.compile()
    return model


def repeated_blocks(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The model's stack of layers: of its ModuleLists whose entries are all of one class, the one
    holding the most parameters (TransformerLM.layers; Llama's model.layers)."""
    stacks = [
        m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) and len({type(b) for b in m}) == 1
    ]
    if not stacks:
        raise ValueError(f"{type(model).__name__} has no ModuleList of identical blocks to compile one by one")
    return max(stacks, key=lambda m: sum(p.numel() for p in m.parameters()))


def build(config: BenchmarkConfig) -> TrainingSetup:
    """Model (random init) on the device, a random batch of token ids, AdamW for train steps."""
    config.validate()
    device = config.resolved_device()
    torch.manual_seed(config.seed)
    mcfg = config.model_config()
    model = TransformerLM.from_config(
        mcfg, attention=config.attention, checkpoint_every=config.checkpoint_every, device=device
    )
    num_parameters = count_parameters(model)
    optimizer = make_optimizer(config.optimizer, model.parameters(), lr=1e-4) if config.mode == "train-step" else None
    if config.compile:
        model = compile_fresh(model, config.compile_scope)
    tokens = torch.randint(0, mcfg.vocab_size, (config.batch_size, config.context_length + 1), device=device)
    return TrainingSetup(config, model, optimizer, tokens[:, :-1], tokens[:, 1:], device, num_parameters)


def time_steps(
    step: Callable[[], None], warmup: int, steps: int, device: torch.device
) -> tuple[list[float], list[float]]:
    """Seconds per step for the warm-up steps and the measured steps, synchronizing after each."""
    warm, measured = [], []
    for i in range(warmup + steps):
        phase = "warmup" if i < warmup else "measured"
        start = timeit.default_timer()
        with annotated(f"{phase} step"):
            step()
            synchronize(device)
        (warm if i < warmup else measured).append(timeit.default_timer() - start)
    return warm, measured


def is_out_of_memory(err: BaseException) -> bool:
    if isinstance(err, torch.OutOfMemoryError):
        return True
    return isinstance(err, RuntimeError) and (
        "out of memory" in str(err).lower() or "can't allocate memory" in str(err).lower()
    )


def device_peak_memory(device: torch.device) -> float:
    """Bytes allocated at most since the last reset of the peak statistics (NaN off CUDA)."""
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else float("nan")


def free_device_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_benchmark(
    config: BenchmarkConfig,
    builder: Callable[[BenchmarkConfig], TrainingSetup] | None = None,
    then: Callable[[TrainingSetup], dict] | None = None,
) -> dict:
    """One tidy row: the configuration, status ("ok" or "OOM"), statistics in ms, peak memory.

    `builder` makes the model and batch (default `build`; the Llama reference has its own);
    `then(setup)`, run after the timed steps on the same model, adds its keys to the row (a
    profile, say, without building and compiling the model a second time).
    """
    row = config.label()
    device = config.resolved_device()
    setup = None
    extra: dict = {}
    peak = float("nan")
    try:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        setup = (builder or build)(config)
        row["parameters"] = setup.num_parameters
        warm, measured = time_steps(setup.step, config.warmup, config.steps, device)
        # The timed steps' peak, read before `then`: what it runs (a profile, a CUDA graph's own
        # memory pool) is not part of the step the row describes.
        peak = device_peak_memory(device)
        if then is not None:
            extra = then(setup)
    except Exception as err:  # noqa: BLE001 - only out-of-memory is turned into a row
        if not is_out_of_memory(err):
            raise
        row.update(status="OOM", error=str(err).splitlines()[0][:200])
        return row
    finally:
        del setup
        free_device_memory()
    ms = [t * 1e3 for t in measured]
    row.update(
        status="ok",
        mean_ms=statistics.fmean(ms),
        std_ms=statistics.stdev(ms) if len(ms) > 1 else 0.0,
        median_ms=statistics.median(ms),
        min_ms=min(ms),
        peak_memory_mib=peak / 2**20,
        warmup_times_ms=[t * 1e3 for t in warm],
        step_times_ms=ms,
        **extra,
    )
    return row
