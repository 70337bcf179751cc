# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Problem `memory_profiling` — where the memory of a step goes
# Spring 2025 handout §1.1.6: profile the memory of the 2.7B model at contexts 128, 256 and 512 —
# (a) the active-memory timelines of an inference forward pass and of a full training step, (b)
# the peak memory of each, (c) the same with bf16 mixed precision, (d) the size of one
# residual-stream activation, (e) the largest allocations and the code that makes them. Spring 2026
# §2.1.6 asks (a)–(e) of its xl model, which has the 2.7B's dimensions (d_model 2560, d_ff 10240,
# 32 layers, 32 heads), at contexts 128 and 2048, and adds (f): what one TransformerBlock saves for
# its backward, and the gradients its backward makes. Every measured peak is set next to the
# analytic model of `cs336_systems.accounting.memory`.

# %% tags=["parameters"]
profile = None            # "cpu" | "gpu"; None picks gpu when CUDA is available
size = None               # model size; None means 2.7B on gpu
context_lengths = None    # None means 128, 256, 512 (2025) and 2048 (2026) on gpu
batch_size = 4
warmup = 1                # steps before measuring, so AdamW's state exists as in steady training
snapshot_contexts = None  # contexts of the recorded timelines (a) and (e); None means 128, 256 and 2048 on gpu
top_allocations = 8       # source lines coloured in the timelines

# %%
from cs336_systems.report import setup_notebook

ctx = setup_notebook("05_memory_profiling", profile=profile)
size = ctx.pick(size, cpu="tiny", gpu="2.7B")
context_lengths = ctx.pick(context_lengths, cpu=[32, 64], gpu=[128, 256, 512, 2048])
snapshot_contexts = ctx.pick(snapshot_contexts, cpu=[context_lengths[-1]], gpu=[128, 256, 2048])

# %%
import linecache

import pandas as pd

from cs336_systems.accounting.memory import describe_size, memory_estimate, residual_stream_bytes
from cs336_systems.benchmarking import BenchmarkConfig, grid, with_predicted_memory
from cs336_systems.experiments.answers import give
from cs336_systems.experiments.answers.memory import timeline_contexts
from cs336_systems.profiling.memory import (
    largest_allocations,
    load_snapshot,
    phase_peaks,
    plot_active_memory,
    snapshot_allocations,
)
from cs336_systems.profiling.memory_snapshots import plot_timelines, record_snapshots, snapshot_table
from cs336_systems.profiling.peak_memory import measure_peak_memory
from cs336_systems.profiling.saved_tensors import block_memory
from cs336_systems.report.environment import repo_root

MIB, GIB = 2**20, 2**30
unit, scale = ("GiB", GIB) if ctx.device.type == "cuda" else ("MiB", MIB)  # tiny CPU models: MiB
u = unit.lower()
base = BenchmarkConfig(size=size, batch_size=batch_size, warmup=warmup, steps=1)
model_config = base.model_config()
autocast_device = ctx.device.type  # CUDA and CPU autocast keep different ops in fp32
ctx.save_table(pd.DataFrame([dict(size=size, d_model=model_config.d_model, d_ff=model_config.d_ff,
                                  num_layers=model_config.num_layers, num_heads=model_config.num_heads,
                                  batch=batch_size)]), "memory_model");

# %% [markdown]
# ## (a) Active memory over one step
# `cs336_systems.profiling.memory.record_step_snapshot` runs the warm-up steps, then records one
# step with `torch.cuda.memory._record_memory_history`, dumps the snapshot with `_dump_snapshot`
# (the pickle opens in https://pytorch.org/memory_viz) and marks the phases. The figure is drawn
# from the pickle: active memory after each allocation or free, the source lines with the largest
# allocations in colour (first frame in our code, not in torch), memory allocated before recording
# (parameters, optimizer state) in light grey.
#
# **Reading the timelines.** In a forward pass without gradients, each layer's intermediates are
# freed as soon as the next layer has consumed them, so memory rises and falls once per layer above
# the constant block of parameters, and there is neither a backward nor optimizer state. In a
# training step autograd keeps every tensor a backward formula needs, so the forward is a ramp; the
# backward releases them layer by layer while parameter gradients (as large as the parameters)
# accumulate; AdamW then updates in place with one temporary per parameter, and the gradients are
# released at its end.
#
# Each handout asks for its own contexts (2025: one of 128, 256 and 512, here 256; 2026: 128 and
# 2048), so a snapshot of each mode is recorded at every context of `snapshot_contexts`. A step that
# runs out of memory is a row with status OOM beside its analytic peak: its snapshot is kept up to
# the failure (recorded without a warm-up step when the warm-up already failed), and the phase that
# was running then is the part of the step that does not fit.

# %%
snapshots = {}
if ctx.device.type == "cuda":
    recorded = record_snapshots(base, snapshot_contexts, lambda c, m: ctx.path(f"memory_snapshot_{size}_ctx{c}_{m}.pickle"))
    snapshots = {(r.mode, r.context_length): load_snapshot(r.path) for r in recorded if r.path is not None}
    snapshot_runs = with_predicted_memory(snapshot_table(recorded).assign(size=size, batch_size=batch_size, precision="fp32"),
                                          ctx.device)
    ctx.save_table(snapshot_runs, "memory_snapshots")
    for r in snapshot_runs[snapshot_runs.status != "ok"].itertuples():
        ctx.md(f"Context {r.context_length}, {r.mode}: **out of memory** in its {r.failed_phase} (analytic peak "
               f"{r.predicted_peak_gib:.1f} GiB, against the GPU's {r.device_memory_gib:.0f} GiB)"
               + (f"; its snapshot, recorded {'without a warm-up step' if r.warmup == 0 else 'after the warm-up'}, ends "
                  "where it ran out." if r.snapshot else "."))
else:
    ctx.not_run("(a) live memory snapshots", "torch.cuda.memory._record_memory_history records the CUDA caching "
                "allocator and this machine has no GPU; the figure below renders the stored example snapshot instead")
    snapshots[("example", snapshot_contexts[0])] = load_snapshot(repo_root() / "tests" / "data" / "memory_snapshot_example.pickle")

# %%
titles = {"forward": "inference forward pass", "train-step": "training step (forward, backward, AdamW)",
          "example": "EXAMPLE: synthetic snapshot from tests/data (not a measurement)"}
phase_tables = [phase_peaks(snapshot_allocations(snapshot), phases).assign(run=mode, context=c)
                for (mode, c), (snapshot, phases) in snapshots.items()]
phase_table = pd.concat(phase_tables, ignore_index=True)
for col in ("start_bytes", "peak_bytes", "end_bytes"):
    phase_table[col.replace("bytes", u)] = phase_table.pop(col) / scale
ctx.save_table(phase_table, "phase_memory");

# %%
if ctx.device.type == "cuda":  # one figure per handout: a row per mode, a column per context it asks for
    for contexts in dict.fromkeys(tuple(timeline_contexts(snapshot_contexts, h)) for h in ("2025", "2026")):
        fig = plot_timelines(recorded, contexts, lambda m, c: f"{size}, context {c}: {titles[m]}", top=top_allocations)
        ctx.save_figure(fig, "active_memory_timelines_ctx" + "_".join(map(str, contexts)))
else:
    (snapshot, phases), = snapshots.values()
    ctx.save_figure(plot_active_memory(snapshot, phases, top=top_allocations, title=titles["example"]), "active_memory_example")
give(ctx, "memory_profiling.a", "memory_profiling.a.2026")

# %% [markdown]
# ## (b) and (c) Peak memory, full and mixed precision, measured and predicted
# Measured: `torch.cuda.max_memory_allocated` over one step after the warm-up (on a CPU the
# profiler's allocation events, above the tensors alive between steps). Predicted: the analytic
# model — parameters, AdamW state, gradients and every tensor autograd saves, walked through the
# backward pass (see `cs336_systems/accounting/memory.py`).

# %%
configs = grid(base, context_length=context_lengths, mode=["forward", "train-step"], precision=["fp32", "bf16"])
rows = []
for config in configs:
    measured = measure_peak_memory(config)
    row = dict(context_length=config.context_length, mode=config.mode, precision=config.precision, status=measured["status"])
    est = memory_estimate(model_config, batch_size, config.context_length, config.mode, config.precision,
                          config.attention, autocast_device=autocast_device)
    row.update({f"measured_{u}": measured.get("peak_bytes", float("nan")) / scale, f"predicted_{u}": est["peak"] / scale,
                "peak_at": est["peak_at"], f"parameters_{u}": est["parameters"] / scale,
                f"optimizer_state_{u}": est["optimizer_state"] / scale, f"activations_{u}": est["activations"] / scale})
    rows.append(row)
peaks = pd.DataFrame(rows)
peaks["error"] = peaks[f"predicted_{u}"] / peaks[f"measured_{u}"] - 1
ctx.save_table(peaks, "peak_memory");
two = peaks.pivot_table(index="context_length", columns=["precision", "mode"], values=f"measured_{u}")
two.columns = [f"{m} {p} ({unit})" for p, m in two.columns]
ctx.save_table(two.reset_index(), "peak_memory_two_numbers");
give(ctx, "memory_profiling.b", "memory_profiling.b.2026")

# %%
def _peak_words(measured: pd.Series, context: int, mode: str) -> str:
    value = measured.get((context, mode))
    return f"{value:.2f} {unit}" if value is not None else "out of memory"


ok = peaks[peaks.status == "ok"]
fp32 = ok[ok.precision == "fp32"].set_index(["context_length", "mode"])[f"measured_{u}"]
bf16 = ok[ok.precision == "bf16"].set_index(["context_length", "mode"])[f"measured_{u}"]
train = ok[ok["mode"] == "train-step"]
within = train[train.error.abs() <= 0.10]
if len(fp32):
    ctx.md(
        "Peak memory (b): " + "; ".join(
            f"context {c}: forward {_peak_words(fp32, c, 'forward')}, training step {_peak_words(fp32, c, 'train-step')}"
            for c in context_lengths) + ". "
        + (f"Out of memory: {', '.join(f'{r.mode} {r.precision} at {r.context_length}' for r in peaks[peaks.status != 'ok'].itertuples())}. "
           if (peaks.status != "ok").any() else "")
        + f"The analytic model is within 10% of the measured peak for {len(within)} of {len(train)} training-step rows"
        + (f" (largest error {100 * train.error.abs().max():.1f}%)." if len(train) else ".")
    )
    trained = [c for c in context_lengths if (c, "train-step") in fp32.index]  # the longest that fitted
    if trained:
        ctx.headline(f"{size} peak, training step fp32, ctx {trained[-1]}", round(float(fp32[(trained[-1], "train-step")]), 2), unit)
    ctx.headline(f"{size} analytic peak error, training steps (max)", round(100 * float(train.error.abs().max()), 1), "%")
    off = train[train.error.abs() > 0.10]
    for r in off.itertuples():
        ctx.md(f"Context {r.context_length}, {r.precision}: measured {getattr(r, f'measured_{u}'):.2f} {unit} against "
               f"{getattr(r, f'predicted_{u}'):.2f} {unit} predicted ({100 * r.error:+.1f}%); the model puts the peak at the "
               f"{r.peak_at}, with {getattr(r, f'activations_{u}'):.2f} {unit} of saved activations, so the difference is "
               f"memory that its list of saved tensors and temporaries does not contain.")

# %% [markdown]
# ### (c) Mixed precision
# Autocast runs the matmuls in bf16 but keeps the fp32 master weights, their fp32 gradients and the
# fp32 AdamW state; only the tensors saved for the backward change: bf16 halves each activation,
# and each weight's bf16 copy, which its matmul saves, is added.

# %%
give(ctx, "memory_profiling.c", "memory_profiling.c.2026")

# %% [markdown]
# ## (d) One residual-stream activation
# A tensor of the residual stream holds batch × context × d_model numbers; in single precision each
# takes 4 bytes.

# %%
d_model = model_config.d_model
residual = pd.DataFrame([dict(context_length=c, elements=batch_size * c * d_model,
                              mib=residual_stream_bytes(batch_size, c, d_model) / MIB) for c in context_lengths])
ctx.save_table(residual, "residual_stream_size");
ctx.md("; ".join(f"context {r.context_length}: {batch_size} × {r.context_length} × {d_model} × 4 bytes = "
                 f"{r.elements * 4:,} bytes = **{r.mib:.2f} MiB**" for r in residual.itertuples()) + ".")
ctx.headline(f"{size} residual stream, ctx {context_lengths[-1]}", round(float(residual.mib.iloc[-1]), 2), "MiB")
give(ctx, "memory_profiling.d", "memory_profiling.d.2026")

# %% [markdown]
# ## (e) The largest allocations of the forward pass, and where they come from

# %%
def _source_line(label: str) -> str:
    """The source text an allocation's label ('model.py:131 forward') points to, if the file is ours and unique."""
    name, _, rest = label.partition(":")
    line = rest.split(" ")[0]
    matches = list((repo_root() / "lib" / "cs336_systems").rglob(name)) if name.endswith(".py") and line.isdigit() else []
    return linecache.getline(str(matches[0]), int(line)).strip() if len(matches) == 1 else ""


forwards = [key for key in snapshots if key[0] in ("forward", "example")]
if not forwards:
    ctx.not_run("(e) largest allocations", "no snapshot of a forward pass could be recorded (out of memory)")
else:
    tables = []
    for mode, c in forwards:
        allocations = snapshot_allocations(snapshots[(mode, c)][0])
        largest = largest_allocations(allocations[allocations.start >= 0], top=10)
        largest["looks_like"] = [describe_size(int(s * MIB), model_config, batch_size, c) for s in largest.size_mib]
        largest["code"] = [_source_line(label) for label in largest.label]
        tables.append(largest.assign(context=c))
    ctx.save_table(pd.concat(tables, ignore_index=True), f"largest_allocations_{forwards[0][0]}")
give(ctx, "memory_profiling.e", "memory_profiling.e.2026")

# %% [markdown]
# ## (f) What one TransformerBlock saves for its backward, and the gradients it makes
# `cs336_systems.profiling.saved_tensors.block_memory` runs one fp32 block of this model on a
# (batch, context, d_model) input under `torch.autograd.graph.saved_tensors_hooks`, naming each
# saved tensor by the operation that made it (the submodule and torch function running, as an
# NVTX range around each operation would in a memory trace), then runs its backward and reads the
# change of allocated memory over it (the allocator's counters on a GPU, the profiler's memory
# events on a CPU). The backward frees the saved tensors while it creates the gradients, so the
# gradients take the change plus the saved bytes freed.

# %%
block_rows, block_ops = [], []
for c in context_lengths:
    ops, summary = block_memory(model_config, batch_size, c, ctx.device)
    block_rows.append(summary)
    block_ops.append(ops.assign(context=c))
ctx.save_table(pd.DataFrame(block_rows), "block_memory");
ctx.save_table(pd.concat(block_ops, ignore_index=True), "block_saved_by_operation", show=False);
give(ctx, "memory_profiling.f")
