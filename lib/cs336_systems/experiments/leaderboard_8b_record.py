"""The spring-2026 leaderboard's optimisation record (notebook 20): the training step of one model timed
one change at a time, from the torch-native baseline to ours, in one process.

Each row (`RECORD`) is a `StepConfig` and an attention kernel applied to the same `TransformerLM`
(`set_attention`; the parameters never change): the step is built, timed as the handout's test times it
(`triton.testing.do_bench(step, rep, warmup)`, its mean; on CPU `measure_times_ms`' calls), its peak
memory read, and it is dropped (optimizer states freed) before the next row. A row that runs out of
memory is recorded as such and the record goes on. Useful work per step is the handout's
(`leaderboard_8b.useful_flops`: matmuls 6 x parameters x tokens, causal attention; no recompute counted).
"""

from __future__ import annotations

import gc
import re
import time
from dataclasses import dataclass, field, replace

import pandas as pd
import torch

from cs336_systems.benchmarking.timing import TimingSettings, measure_times_ms
from cs336_systems.model import TransformerLM, set_attention
from cs336_systems.training.config import StepConfig
from cs336_systems.training.leaderboard_8b import ACTIVATION_MEMORY_BUDGET, TRACED_STEP, useful_flops
from cs336_systems.training.memory_plan import (
    GIB,
    MemoryTerms,
    PlanDoesNotFit,
    fixed_memory_bytes,
    plan_recompute,
    recompute_cost,
)
from cs336_systems.training.step import PHASES, TrainStep, build_train_step, phase_times


@dataclass(frozen=True)
class RecordRow:
    """One row of the record: its name, what changed from the row before, the attention kernel, and the
    step's configuration besides the learning rate and compilation (`step_config`)."""

    variant: str
    change: str
    attention: str
    options: dict = field(default_factory=dict)

    def step_config(self, compile_blocks: bool, lr: float = 1e-4) -> StepConfig:
        """The row's StepConfig; uncompiled, without the compiler's activation memory budget (it has no
        effect there), so on the CPU profile the rows `kept_attention` and `ours` run the same step."""
        options = dict(self.options)
        if not compile_blocks:
            options.pop("activation_memory_budget", None)
        return StepConfig(lr=lr, compile_blocks=compile_blocks, **options)


_BASELINE = dict(recompute="all", loss="cross_entropy", optimizer="torch_adamw", keep_attention=False)
_PLAN = dict(recompute="plan", loss="fused", optimizer="fused_adamw", state_dtype=torch.bfloat16, keep_attention=False)
_KEPT_ATTENTION = dict(_PLAN, keep_attention=True)
_OURS = dict(_KEPT_ATTENTION, activation_memory_budget=ACTIVATION_MEMORY_BUDGET)
_OURS_OFFLOADED = dict(_OURS, offload_optimizer_states=True)
RECORD = (
    RecordRow(
        "torch_native",
        "the baseline: SDPA, every block recomputed, the LM head's full logits and "
        "F.cross_entropy, torch.optim.AdamW(fused=True)",
        "sdpa",
        _BASELINE,
    ),
    RecordRow("flash_attention", "our FlashAttention (flash_triton) instead of SDPA", "flash_triton", _BASELINE),
    RecordRow(
        "fused_loss",
        "the fused LM head + cross-entropy: token chunks, never the [N, V] logits",
        "flash_triton",
        dict(_BASELINE, loss="fused"),
    ),
    RecordRow(
        "fused_adamw",
        "our FusedAdamW, bf16 states stochastically rounded (one launch per group)",
        "flash_triton",
        dict(_BASELINE, loss="fused", optimizer="fused_adamw", state_dtype=torch.bfloat16),
    ),
    RecordRow(
        "recompute_plan",
        "the recompute plan: the last blocks keep their activations, as many as memory "
        "allows (one compiled block's activations measured on the device)",
        "flash_triton",
        _PLAN,
    ),
    RecordRow(
        "kept_attention",
        "selective recompute: recomputed blocks keep attention's output and logsumexp, so "
        "their recompute skips the attention forward; the plan counts the kept outputs",
        "flash_triton",
        _KEPT_ATTENTION,
    ),
    RecordRow(
        "ours",
        f"the compiled blocks' partitioner saves less (activation memory budget "
        f"{ACTIVATION_MEMORY_BUDGET}), recomputing cheap work inside each block's backward: smaller blocks, "
        f"so the plan keeps more of them",
        "flash_triton",
        _OURS,
    ),
    RecordRow(
        "ours_offloaded_states",
        "ours with AdamW's states in pinned host memory through the forward, copied on a side stream: the plan "
        "gives their GPU memory to kept blocks",
        "flash_triton",
        _OURS_OFFLOADED,
    ),
    RecordRow(
        "ours_fp32_states_offloaded",
        "with fp32 AdamW states (exact AdamW), in host memory through the forward: twice the bytes copied, "
        "none of them held by the forward",
        "flash_triton",
        dict(_OURS_OFFLOADED, state_dtype=torch.float32),
    ),
)
RECORD_COLUMNS = [
    "variant",
    "change",
    "step_ms",
    "peak_gib",
    "tflops",
    "ceiling_fraction",
    "vs_baseline",
    "blocks_recomputed",
    "attention_kept",
    "status",
    "note",
]


def release(step: TrainStep | None = None) -> None:
    """Drop a step's optimizer states and the model's gradients, and return the memory to the device."""
    if step is not None:
        step.optimizer.state.clear()
        for p in step.model.parameters():
            p.grad = None
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def time_step(
    step: TrainStep, x: torch.Tensor, y: torch.Tensor, rep_ms: int, warmup_ms: int, cpu_steps: int = 2
) -> float:
    """Milliseconds per step as the handout's test takes them (do_bench's mean) on CUDA; on CPU the
    median of `cpu_steps` timed calls after an untimed first."""
    if x.device.type == "cuda":
        import triton.testing

        return float(triton.testing.do_bench(lambda: step.step(x, y), rep=rep_ms, warmup=warmup_ms))
    times = measure_times_ms(lambda: step.step(x, y), x.device, TimingSettings(cpu_steps=cpu_steps))
    return float(pd.Series(times).median())


def run_record(
    model: TransformerLM,
    x: torch.Tensor,
    y: torch.Tensor,
    rows=RECORD,
    *,
    compile_blocks: bool,
    rep_ms: int = 5000,
    warmup_ms: int = 1000,
    ceiling_tflops: float | None = None,
) -> pd.DataFrame:
    """One row per `RecordRow` (`RECORD_COLUMNS`): step time, peak memory, useful TFLOP/s, the fraction of
    the matmul ceiling, the ratio to the first row's time, and how many blocks the step recomputed."""
    cfg = model.config
    matmul_params = sum(p.numel() for p in model.parameters()) - model.token_embeddings.weight.numel()
    flops = useful_flops(matmul_params, cfg.num_layers, x.numel(), x.shape[1], d_model=cfg.d_model)
    out = []
    compiled_under: object = "unknown"  # the activation memory budget the blocks' compiled code was made with
    for row in rows:
        record = dict(variant=row.variant, change=row.change, status="ok", note="")
        step = None
        try:
            set_attention(model, row.attention)
            release()
            if x.device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(x.device)
            config = row.step_config(compile_blocks)
            if compile_blocks and config.activation_memory_budget != compiled_under:
                # Compiled code stays cached on the blocks whatever budget it was partitioned under (the
                # guards do not see the setting): drop it, so this row compiles under its own.
                torch._dynamo.reset()
                compiled_under = config.activation_memory_budget
            step = build_train_step(model, config)
            ms = time_step(step, x, y, rep_ms, warmup_ms)
            plan = step.plans.get((x.shape[0], x.shape[1]))
            record.update(
                step_ms=ms,
                tflops=flops / (ms * 1e-3) / 1e12,
                blocks_recomputed=plan.recomputed_blocks if plan else 0,
                attention_kept=bool(plan and plan.keep_attention),
            )
            if x.device.type == "cuda":
                record["peak_gib"] = torch.cuda.max_memory_allocated(x.device) / GIB
        except torch.OutOfMemoryError as err:
            record.update(status="OOM", note=str(err).split("\n")[0][:200])
        except PlanDoesNotFit as err:  # the message says what to change
            record.update(status="does not fit", note=str(err)[:800])
        finally:
            release(step)
            del step
        out.append(record)
    df = pd.DataFrame(out)
    for col in RECORD_COLUMNS:
        if col not in df:
            df[col] = pd.NA
    df["ceiling_fraction"] = df.tflops / ceiling_tflops if ceiling_tflops else pd.NA
    base = df.step_ms.iloc[0] if df.status.iloc[0] == "ok" else float("nan")
    df["vs_baseline"] = df.step_ms / base
    return df[RECORD_COLUMNS]


LEADERBOARD_COLUMNS = [
    "variant",
    "step_ms",
    "peak_gib",
    "tflops",
    "ceiling_tflops",
    "world_size",
    "device",
    "rep_ms",
    "warmup_ms",
]


def leaderboard_rows(
    record: pd.DataFrame,
    ceiling_tflops: float | None,
    world_size: int,
    device: str,
    torchrun_results: pd.DataFrame | None = None,
    rep_ms: int | None = None,
    warmup_ms: int | None = None,
) -> pd.DataFrame:
    """The committed `leaderboard_8b.csv`: the baseline and the final step of the record (timed by
    `do_bench(rep=rep_ms, warmup=warmup_ms)`), then the runs of `torchrun_step` that succeeded (their own
    world size, device and do_bench settings)."""
    picked = record[record.variant.isin(["torch_native", "ours"])].copy()
    picked["ceiling_tflops"] = ceiling_tflops
    picked["world_size"] = world_size
    picked["device"] = device
    picked["rep_ms"] = rep_ms
    picked["warmup_ms"] = warmup_ms
    parts = [picked[LEADERBOARD_COLUMNS]]
    if torchrun_results is not None and len(torchrun_results):
        ran = torchrun_results[torchrun_results.status == "ok"].rename(
            columns=dict(ms="step_ms", useful_tflops="tflops")
        )
        if len(ran):
            parts.append(ran.assign(ceiling_tflops=ceiling_tflops).reindex(columns=LEADERBOARD_COLUMNS))
    return pd.concat(parts, ignore_index=True)


def memory_plan(
    model: TransformerLM, x: torch.Tensor, y: torch.Tensor, config: StepConfig
) -> tuple[pd.DataFrame, MemoryTerms]:
    """The memory of `config`'s step, analytic against measured, in GiB, and the plan's terms
    (`TrainStep.memory_terms`): parameters, gradients, AdamW states, one block's saved activations
    (measured, `measure_block_memory`) times the blocks that keep them, the recomputed blocks' inputs and
    kept attention outputs, the loss workspace, one block's working memory; then the peak the plan predicts
    (`recompute_cost`) against the peak of a second step (the first allocates AdamW's states only at its
    end, after the activations are gone)."""
    batch, seq = x.shape
    release()
    step = build_train_step(model, config)
    try:
        step.step(x, y)
        plan = step.plans[(batch, seq)]
        terms = step.memory_terms(x, plan.keep_attention)
        if x.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(x.device)
        step.step(x, y)
        peak = torch.cuda.max_memory_allocated(x.device) if x.device.type == "cuda" else pd.NA
        params = sum(p.numel() * p.element_size() for p in model.parameters())
        grads = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None)
        states = sum(
            t.numel() * t.element_size()
            for s in step.optimizer.state.values()
            for t in s.values()
            if isinstance(t, torch.Tensor) and t.dim() > 0
        )
        state_size = torch.tensor([], dtype=config.state_dtype).element_size()
        kept, recomputed = plan.kept_blocks, plan.recomputed_blocks
        analytic_states = 2 * sum(p.numel() for p in model.parameters()) * state_size
        attention = terms.attention if plan.keep_attention else 0
        rows = [
            ("parameters", params, params),
            ("gradients (all but the LM head's made in the backward)", params, grads),
            ("AdamW states", analytic_states, states),
            (f"saved activations ({kept} blocks keep theirs)", kept * terms.block, kept * terms.block),
            (f"recomputed blocks' inputs ({recomputed})", recomputed * terms.checkpoint, pd.NA),
            (
                f"recomputed blocks' attention outputs ({recomputed if attention else 0} kept)",
                recomputed * attention,
                pd.NA,
            ),
            ("loss workspace and residual streams", terms.fixed - 2 * params - analytic_states, pd.NA),
            ("one block's working memory (measured)", terms.transient, terms.transient),
            (
                "peak (analytic: recompute_cost; measured: a second step's)",
                recompute_cost(len(plan.recompute), kept, terms, plan.keep_attention),
                peak,
            ),
        ]
        table = pd.DataFrame(
            [(n, a / GIB, m / GIB if m is not pd.NA else pd.NA) for n, a, m in rows],
            columns=["item", "analytic_gib", "measured_gib"],
        )
        return table, terms
    finally:
        release(step)


_STEP_CATEGORIES = {"matmul": "matmul", "attention": "attention", "optimizer": "optimizer", "copy": "copy / fill"}


def kernel_category(name: str) -> str:
    """A kernel's share of the step: `profiling.kernel_names.kernel_category`'s matmul, attention,
    optimizer and copy, the fused loss's own kernel (`cross_entropy_rows_kernel`; the project's categories
    have no loss), and the rest together."""
    from cs336_systems.profiling.kernel_names import kernel_category as category_of

    if re.search(r"cross_entropy|logsumexp|nll_loss|log_softmax", name, re.IGNORECASE):
        return "loss"
    return _STEP_CATEGORIES.get(category_of(name), "elementwise / other")


def profile_step(
    step: TrainStep, x: torch.Tensor, y: torch.Tensor, warmup: int = 1
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One step after `warmup` steps: the time of each phase (`PHASES`, between CUDA events the step records
    at its phase boundaries; wall time on CPU), then one step under torch.profiler for the GPU kernels' time
    by category (`kernel_category`)."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warmup):
        step.step(x, y)
    step.phase_marks = []
    step.step(x, y)
    times = phase_times(step.phase_marks)
    step.phase_marks = None
    total_ms = sum(times.values())
    phases = pd.DataFrame(
        [dict(phase=p, ms=times[p], share=times[p] / total_ms) for p in PHASES], columns=["phase", "ms", "share"]
    )
    kernels: dict[str, float] = {}
    if x.device.type == "cuda":
        torch.cuda.synchronize(x.device)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            step.step(x, y)
            torch.cuda.synchronize(x.device)
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA and e.name not in PHASES:
                category = kernel_category(e.name)
                kernels[category] = kernels.get(category, 0.0) + e.time_range.elapsed_us() / 1e3
    total = sum(kernels.values())
    kernel_df = pd.DataFrame(
        [
            dict(category=c, ms=t, share=t / total if total else float("nan"))
            for c, t in sorted(kernels.items(), key=lambda kv: -kv[1])
        ],
        columns=["category", "ms", "share"],
    )
    return phases, kernel_df


def seconds_to_first_step(build, x: torch.Tensor, y: torch.Tensor) -> float:
    """Wall seconds from `build()` (which makes the step) through its first completed step: compilation
    and autotuning included (an empty cache is the caller's business)."""
    start = time.perf_counter()
    step = build()
    step.step(x, y)
    if x.device.type == "cuda":
        torch.cuda.synchronize(x.device)
    elapsed = time.perf_counter() - start
    release(step)
    return elapsed


def loss_curves(make_model, x: torch.Tensor, y: torch.Tensor, steps: int = 50, lr: float = 3e-3) -> pd.DataFrame:
    """`steps` steps of a small model on one batch, from the same weights: the plain reference (naive
    attention, F.cross_entropy, torch.optim.AdamW) and ours with fp32 and with bf16 AdamW states. One row
    per (variant, step) with the loss; `make_model()` gives a fresh model with the same weights each call."""
    from cs336_systems.attention.naive import naive_attention

    variants = {
        "plain (naive attention, F.cross_entropy, torch AdamW)": (
            naive_attention,
            dict(recompute="none", loss="cross_entropy", optimizer="torch_adamw"),
        ),
        "ours, fp32 states": ("flash_triton", dict(recompute="none", state_dtype=torch.float32)),
        "ours, bf16 states (stochastic rounding)": ("flash_triton", dict(recompute="none", state_dtype=torch.bfloat16)),
    }
    rows = []
    for name, (attention, options) in variants.items():
        model = make_model()
        set_attention(model, attention)
        step = build_train_step(model, StepConfig(lr=lr, weight_decay=0.0, **options))
        for i in range(steps):
            rows.append(dict(variant=name, step=i, loss=float(step.step(x, y))))
    return pd.DataFrame(rows)


def torchrun_step(
    variant: str,
    nproc: int,
    *,
    layers: int,
    context: int,
    rep_ms: int,
    warmup_ms: int,
    compile_blocks: bool,
    state_dtype: str = "bf16",
    timeout_s: float = 900.0,
    trace: str | None = None,
    cold_cache: bool = False,
    offload_states: bool = True,
) -> dict:
    """`torchrun --nproc-per-node nproc -m cs336_systems.training.leaderboard_8b` (the handout's command
    on `nproc` GPUs, batch 1 per GPU) in a subprocess: rank 0's result, with `status` "ok", or "failed"
    and the end of its output as `note`, or the refusal the command wrote (status "does not fit", its
    `need_gib`, `budget_gib` and `would_fit`), and the command's wall seconds (`wall_s`). `trace`: the command's
    `--trace` (a step profiled as the timed ones run, rank 0's Chrome trace there); `cold_cache`: empty Triton and
    Inductor caches of the command's own, as on a fresh machine (the handout times from an empty cache);
    `offload_states`: ours with AdamW's states in host memory through the forward (the command's default;
    False: `--no-offload-states`). A failed run's row names its `layers` and `context` too."""
    import json
    import os
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    import cs336_systems

    with tempfile.TemporaryDirectory(prefix="cs336_torchrun_") as tmp:
        out = Path(tmp) / "result.json"
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nproc-per-node={nproc}",
            "-m",
            "cs336_systems.training.leaderboard_8b",
            "--variant",
            variant,
            "--layers",
            str(layers),
            "--context",
            str(context),
            "--rep",
            str(rep_ms),
            "--warmup",
            str(warmup_ms),
            "--state-dtype",
            state_dtype,
            "--json",
            str(out),
        ] + (["--compile-blocks"] if compile_blocks else [])
        cmd += ["--trace", str(trace)] if trace else []
        if variant == "ours":
            cmd += ["--offload-states" if offload_states else "--no-offload-states"]
        lib = str(Path(cs336_systems.__file__).resolve().parents[1])
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [lib, os.environ.get("PYTHONPATH")])))
        env.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")  # as in notebook 20: no stranded GiBs
        if cold_cache:
            env.update(TRITON_CACHE_DIR=str(Path(tmp) / "triton"), TORCHINDUCTOR_CACHE_DIR=str(Path(tmp) / "inductor"))

        def failed(note: str, wall_s: float) -> dict:
            return dict(
                variant=variant, world_size=nproc, layers=layers, context=context, status="failed", note=note,
                wall_s=wall_s,
            )  # fmt: skip

        start = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
        except subprocess.TimeoutExpired:
            return failed(f"timed out after {timeout_s:.0f} s", timeout_s)
        wall_s = time.perf_counter() - start
        if proc.returncode and out.exists():  # a refusal the command wrote down (`status` "does not fit")
            return dict(json.loads(out.read_text()), wall_s=wall_s)
        if proc.returncode or not out.exists():
            lines = (proc.stdout + "\n" + proc.stderr).strip().splitlines()
            # the command's own refusal or the first exception line says why; torchrun's summary does not
            why = [ln for ln in lines if ln.startswith("leaderboard_8b:") or "Error:" in ln][:2] or lines[-4:]
            return failed(" | ".join(why)[-1200:], wall_s)  # 1200: a plan's refusal whole, with what would fit
        return dict(json.loads(out.read_text()), status="ok", note="", wall_s=wall_s)


def two_gpu_profile(trace) -> tuple[pd.DataFrame, pd.DataFrame, object]:
    """A traced two-GPU step (the command's `--trace`): the per-stream summary (`profiling.streams.stream_summary`),
    the communication hidden behind compute (`communication_overlap`) and the streams' timeline figure. Where
    the trace has the command's `TRACED_STEP` range (a step traced after another, whose parameter exchange runs
    into it, as in the timed loop), all of it is cut to that step's compute span: from its first compute kernel
    to its last, so its own exchange, which the next step's forward would overlap, is left out. The figure has
    no phase rows: the step's CPU-side ranges run ahead of the GPU, and autograd's thread leaves the GPU-side
    copy of "backward" empty; the kernels' categories show the phases."""
    from cs336_systems.profiling.streams import clip_to_window, communication_overlap, compute_span, stream_summary
    from cs336_systems.profiling.timeline import plot_timeline
    from cs336_systems.profiling.trace import GPU_KINDS, events_in_ranges, load_trace

    events, window = load_trace(trace), None
    if TRACED_STEP in set(events.loc[events["kind"] == "range", "name"]):
        window = compute_span(events_in_ranges(events, TRACED_STEP, kinds=GPU_KINDS))
        events = clip_to_window(events, *window)
    fig = plot_timeline(events, window=window, title="8B step, rank 0 of 2 GPUs: compute and communication streams")
    return stream_summary(events), communication_overlap(events), fig


def kept_blocks_table(
    model: TransformerLM,
    terms: MemoryTerms,
    batch: int,
    seq: int,
    budget_bytes: int | None,
    world_sizes=(1,),
    state_dtypes=(torch.bfloat16,),
) -> pd.DataFrame:
    """Per rank, for each world size and AdamW state dtype: the fixed memory (parameters and gradients
    whole, states 1/N) and the plan within `budget_bytes` (one GPU's; None: every block keeps its
    activations; None in the columns: not even recomputing every block fits), the other terms `terms`'."""
    rows = []
    for world in world_sizes:
        for state_dtype in state_dtypes:
            fixed = fixed_memory_bytes(
                model, state_dtype, batch, seq, world_size=world, bucket_bytes=StepConfig().bucket_bytes
            )
            kept, keep_attention = model.config.num_layers, False
            if budget_bytes is not None:
                try:
                    plan = plan_recompute(model.config.num_layers, replace(terms, fixed=fixed), budget_bytes)
                    kept, keep_attention = plan.kept_blocks, plan.keep_attention
                except PlanDoesNotFit:
                    kept = keep_attention = None
            rows.append(
                dict(
                    world_size=world,
                    state_dtype=str(state_dtype).removeprefix("torch."),
                    fixed_gib_per_rank=fixed / GIB,
                    blocks_keeping_activations=kept,
                    attention_kept=keep_attention,
                )
            )
    return pd.DataFrame(rows)


def _data_parallel_rank(ctx, make, x, y, config):
    """One rank of `data_parallel_check`: its slice of the batch, one step, its weights and state count."""
    model = make()
    rows = x.shape[0] // ctx.world_size
    mine = slice(ctx.rank * rows, (ctx.rank + 1) * rows)
    step = build_train_step(model, config)
    start = time.perf_counter()
    loss = float(step.step(x[mine], y[mine]))
    seconds = time.perf_counter() - start
    states = sum(1 for s in step.optimizer.local_optimizer.state.values() if s)
    return dict(
        rank=ctx.rank,
        loss=loss,
        seconds=seconds,
        owned_states=states,
        weights=torch.cat([p.detach().flatten() for p in model.parameters()]),
    )


def data_parallel_check(
    make, x: torch.Tensor, y: torch.Tensor, config: StepConfig, world_size: int = 2, backend: str = "gloo"
) -> pd.DataFrame:
    """The data-parallel step on `world_size` local processes (each its slice of the batch, one step): per
    rank its loss, wall time, how many parameters' AdamW states it keeps, and whether its weights after the
    step equal rank 0's bit for bit. `make()` builds the model (the same seed on every rank)."""
    from cs336_systems.distributed import spawn

    ranks = spawn(_data_parallel_rank, world_size, args=(make, x, y, config), backend=backend, timeout_s=600)
    return pd.DataFrame(
        [
            dict(
                rank=r["rank"],
                loss=r["loss"],
                seconds=r["seconds"],
                owned_states=r["owned_states"],
                same_weights_as_rank0=bool(torch.equal(r["weights"], ranks[0]["weights"])),
            )
            for r in ranks
        ]
    )


def scaled_down_model(seed: int = 0) -> TransformerLM:
    """The CPU profile's model (2 layers, d_model 64, 4 heads, d_ff 128, vocab 512, context 64, fp32, our
    attention), the same weights for a seed: what `data_parallel_check` builds on every rank."""
    torch.manual_seed(seed)
    return TransformerLM(512, 64, 64, 2, 4, 128, attention="flash_triton", dtype=torch.float32)
