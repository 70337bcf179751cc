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
# # Problem `torch_compile` — compiled attention, then the compiled model
# Spring 2025 handout §1.3. (a) The naive attention of notebook 07 compiled with `torch.compile`,
# side by side with the uncompiled one on the same grid (batch 8, no head dimension,
# d ∈ {16, 32, 64, 128} × seq ∈ {256, …, 16384}, timed forwards and backwards after warm-up, continued
# until out of memory). (b) compiles the Transformer LM (block by block, and as one whole-model graph) and sets our best
# training step against Hugging Face's Llama of the same shape: see the last section.

# %% tags=["parameters"]
profile = None            # cpu or gpu, None picks gpu when CUDA is available
d_models = None           # head dimensions, None means the default of the profile
seq_lens = None           # sequence lengths of the grid, None means the default of the profile
batch = 8
warmup = None             # untimed steps before each timed series, after the first call that compiles
steps = None              # timed forwards and timed backwards per configuration
memory_budget_mib = None  # None means the whole device on GPU, the cpu profile simulates a small budget
max_seq_len = 2**18       # the doubling past the grid stops here at the latest
isolate = None            # fresh processes per head dimension and after each OOM, None means on GPU only
compile_sizes = None       # part b, model sizes, None means small, medium, large, xl, 2.7B on gpu
compile_context = None     # part b, context length, None means 256 on gpu
compile_modes = None       # part b, None means forward, forward-backward, train-step on gpu
compile_scope = "blocks"   # part b and the Llama comparison: "blocks" compiles each block (regional), "model" the whole model
whole_model_sizes = None   # part b, sizes also compiled as one whole-model graph, None means small on gpu
compile_batch = 4
compile_warmup = None      # None means 5 on gpu
compile_steps = None       # None means 10 on gpu
llama_sizes = None         # best configuration against Llama, None means xl and 2.7B on gpu
llama_contexts = None      # None means 256 and 512 on gpu
llama_attentions = None    # attention candidates for the best configuration, None means sdpa and flash_triton on gpu
llama_bar = 0.8            # pass when our step time is at most this fraction of the Llama step time
llama_optimizer = "torch-adamw-fused"  # steps both models: one of cs336_systems.optim.OPTIMIZERS
llama_compiled = None      # [size, context] pairs where Llama is compiled too, None means the first pair

# %%
from cs336_systems.report import setup_notebook

ctx = setup_notebook("08_torch_compile", profile=profile)
d_models = ctx.pick(d_models, cpu=[16], gpu=[16, 32, 64, 128])
seq_lens = ctx.pick(seq_lens, cpu=[64, 128], gpu=[256, 1024, 4096, 8192, 16384])
warmup = ctx.pick(warmup, cpu=1, gpu=5)
# 30 timed steps, not the 100 of notebook 07: two implementations and up to 16k tokens would take
# over four minutes, and on the H100 the standard deviation was under 2% of the mean.
steps = ctx.pick(steps, cpu=3, gpu=30)
memory_budget_mib = ctx.pick(memory_budget_mib, cpu=4, gpu=None)

# %%
import matplotlib.pyplot as plt
import seaborn as sns

from cs336_systems.experiments.answers import give
from cs336_systems.experiments.answers.words import times as ratio
from cs336_systems.experiments.answers.words import times_span as ratio_span
from cs336_systems.experiments.attention_benchmark import MiB, attention_sweep, merge_compiled, seq_len_axis
from cs336_systems.report.tables import fmt_ms

budget_bytes = None if memory_budget_mib is None else int(memory_budget_mib * MiB)

# %% [markdown]
# ## (a) Compiled against uncompiled attention
# `torch.compile(naive_attention)` traces the function into one graph; Inductor fuses the scaling,
# the softmax's max, subtraction, exponential, sum and division into generated kernels (Triton on
# a GPU, C++ on a CPU) around the two matmuls, and its min-cut partitioner decides which
# intermediates to save for the backward and which to recompute. It is compiled with
# `dynamic=True`: one graph with symbolic sizes serves every sequence length and head dimension, so
# a process compiles once, in the first call of its first configuration (`first_call_ms`, before
# the warm-up), and never recompiles per shape. On a GPU, as in notebook 07, each head dimension's
# grid runs in a fresh process, so each compiles anew (Inductor's on-disk cache makes the later ones
# cheaper).

# %%
implementations = {"eager": "naive", "compiled": "compiled:naive"}
df = attention_sweep(
    implementations, d_models, seq_lens, batch=batch, device=ctx.device, warmup=warmup, steps=steps,
    memory_budget_bytes=budget_bytes, max_seq_len=max_seq_len, isolate=isolate,
)
ctx.save_table(df, "compiled_attention_sweep_raw", show=False)
wide = merge_compiled(df, "eager", "compiled")
columns = ["d_model", "seq_len", "status_eager", "status_compiled", "forward_ms_eager", "forward_ms_compiled",
           "forward_speedup", "backward_ms_eager", "backward_ms_compiled", "backward_speedup",
           "saved_for_backward_mib_eager", "saved_for_backward_mib_compiled", "first_call_ms_compiled"]
ctx.save_table(wide[columns], "compiled_vs_eager");

# %%
give(ctx, "torch_compile.a")

# %%
both = wide[(wide.status_eager == "ok") & (wide.status_compiled == "ok")]
if len(both):
    best = both.loc[both.forward_speedup.idxmax()]
    saved_ratio = both.saved_for_backward_mib_compiled / both.saved_for_backward_mib_eager
    first_calls = both.first_call_ms_compiled
    ctx.md(
        f"Over the {len(both)} configurations where both ran, the compiled attention's forward is "
        f"{ratio_span(both.forward_speedup)} as fast as the eager one and its backward {ratio_span(both.backward_speedup)}. "
        f"The largest forward gain, {ratio(best.forward_speedup)}, is at d = {best.d_model}, sequence length {best.seq_len:,} "
        f"({fmt_ms(best.forward_ms_eager)} → {fmt_ms(best.forward_ms_compiled)}). The compiled version saves "
        f"{ratio_span(saved_ratio)} the eager one's memory for the backward. Its first call per configuration takes "
        f"{fmt_ms(first_calls.min())}–{fmt_ms(first_calls.max())}; the first call in a process compiles the "
        f"dynamic-shape graph, which later shapes reuse."
    )
    ctx.headline("compiled attention forward speed-up (range over configurations)", ratio_span(both.forward_speedup))
    ctx.headline("compiled attention backward speed-up (range over configurations)", ratio_span(both.backward_speedup))
first_oom = df[df.status == "OOM"].groupby("implementation").seq_len.min()
if len(first_oom):
    ctx.md("First out-of-memory sequence length: " + "; ".join(f"{name}: {n:,}" for name, n in first_oom.items()) + ".")

# %%
long = both.melt(id_vars=["d_model", "seq_len"], value_vars=["forward_speedup", "backward_speedup"],
                 var_name="pass", value_name="speedup")
fig, ax = plt.subplots(figsize=(7, 4))
sns.lineplot(data=long, x="seq_len", y="speedup", hue="d_model", style="pass", marker="o", palette="viridis", ax=ax)
ax.axhline(1.0, color="grey", lw=1, ls="--")
seq_len_axis(ax, long.seq_len)
ax.set(ylabel="eager time / compiled time", title="torch.compile speed-up of the naive attention")
ctx.save_figure(fig, "compiled_attention_speedup")

# %% [markdown]
# **Why.** The eager attention runs each elementwise step of the softmax as its own kernel, each
# reading and writing a B×N×N tensor from memory; those steps are memory bound, so their time is
# the traffic. Compiling fuses them into a few kernels that read the scores once and write the
# probabilities once; the two matmuls are unchanged (both versions call the same GEMM), so what
# compiling can save is the softmax's share of the time. Fusion also leaves fewer intermediates for
# autograd to keep for the backward (the saved-memory columns above measure how many fewer). The N²
# terms themselves remain: compiling does not change the algorithm, only how it is scheduled.

# %% [markdown]
# ## Part (b): the compiled model
# Handout §1.3 `torch_compile` (b): the vanilla and the `torch.compile`d Transformer LM — forward, forward+backward and a full training step — side by side, and the production alternative (`transformers.LlamaForCausalLM` of the same shape) where `transformers` is installed.

# %% [markdown]
# `torch.compile` traces the TransformerLM into graphs and lets Inductor generate fused kernels:
# RMSNorm, RoPE, the residual additions, SiLU and the softmax's elementwise steps each become a few
# generated kernels instead of one kernel per operation, while the matmuls still go to cuBLAS.
# Two scopes (`harness.compile_fresh`): `"model"`, `torch.compile(model)`, traces the whole model
# into one graph per grad mode, and the graph — and its compile time — grows with the depth (the
# 48 blocks of xl are 48 inlined copies); `"blocks"`, PyTorch's regional compilation, compiles each
# `TransformerBlock` in place, and since the blocks are one class Dynamo compiles the first and
# reuses its code for the rest, so a model of any depth compiles in one block's time. Nothing but
# the embedding lookup, the final norm and the output head stays eager, and no fusion crosses a
# block boundary. Each size is timed vanilla and compiled (scope `compile_scope`) for a forward
# pass, a forward+backward pass and a full training step (the optimizer step itself is not
# compiled), same batch, same process; the sizes in `whole_model_sizes` are also compiled whole, to
# show what the scope changes. `compiled_first_call_s` is the compiled model's first call in each
# mode: the compilation of the graph that mode needs first (forward: the no-grad graph;
# forward-backward: the training graph; train-step reuses it).

# %%
compile_sizes = ctx.pick(compile_sizes, cpu=["nano"], gpu=["small", "medium", "large", "xl", "2.7B"])
compile_context = ctx.pick(compile_context, cpu=32, gpu=256)
compile_modes = ctx.pick(compile_modes, cpu=["forward"], gpu=["forward", "forward-backward", "train-step"])
compile_warmup = ctx.pick(compile_warmup, cpu=1, gpu=5)
compile_steps = ctx.pick(compile_steps, cpu=3, gpu=10)
whole_model_sizes = ctx.pick(whole_model_sizes, cpu=["nano"], gpu=["small"]) if compile_scope != "model" else []
llama_sizes = ctx.pick(llama_sizes, cpu=["nano"], gpu=["xl", "2.7B"])
llama_contexts = ctx.pick(llama_contexts, cpu=[32], gpu=[256, 512])
llama_attentions = ctx.pick(llama_attentions, cpu=["naive", "sdpa"], gpu=["sdpa", "flash_triton"])
llama_compiled = [(llama_sizes[0], llama_contexts[0])] if llama_compiled is None else llama_compiled

from dataclasses import replace

import pandas as pd
import torch

from cs336_systems.benchmarking import BenchmarkConfig
from cs336_systems.benchmarking.ceiling import measure_matmul_tflops
from cs336_systems.benchmarking.compiled import (
    best_versus_llama,
    compile_comparison,
    optimizer_comparison,
    step_phase_table,
)
from cs336_systems.benchmarking.llama_reference import transformers_available
from cs336_systems.report.tables import fmt_ms

# %%
compile_base = BenchmarkConfig(context_length=compile_context, batch_size=compile_batch, warmup=compile_warmup, steps=compile_steps,
                               compile_scope=compile_scope)
vanilla_vs_compiled = compile_comparison(compile_base, compile_sizes, compile_modes)
if whole_model_sizes:
    whole_model = compile_comparison(replace(compile_base, compile_scope="model"), whole_model_sizes, compile_modes)
    vanilla_vs_compiled = pd.concat([vanilla_vs_compiled, whole_model], ignore_index=True)
ctx.save_table(vanilla_vs_compiled, "compiled_model");

# %%
give(ctx, "torch_compile.b", "torch_compile.b.2026")

# %%
both = vanilla_vs_compiled[(vanilla_vs_compiled.status == "ok") & (vanilla_vs_compiled.scope == compile_scope)]
if len(both):
    fig, ax = plt.subplots(figsize=(7, 4))
    sns.barplot(data=both, x="size", y="speedup", hue="mode", order=[s for s in compile_sizes if s in set(both["size"])], ax=ax)
    ax.axhline(1.0, color="grey", lw=1, ls="--")
    ax.set(ylabel="vanilla time / compiled time", title=f"torch.compile ({compile_scope}) on the model, context {compile_context}")
    ctx.save_figure(fig, "compiled_model_speedup")
    by_mode = both.groupby("mode", sort=False).speedup
    ctx.md(
        f"Speed-up of the compiled (scope `{compile_scope}`) over the vanilla model (vanilla time / compiled time): "
        + "; ".join(f"{m} {ratio_span(g)}" + (f" over the {g.size} sizes" if g.size > 1 else "") for m, g in by_mode)
        + f". For **{both.iloc[-1]['size']}**: " + ", ".join(
            f"{r['mode']} {fmt_ms(r.vanilla_ms)} → {fmt_ms(r.compiled_ms)}" for _, r in both[both["size"] == both.iloc[-1]["size"]].iterrows())
        + "."
    )
    first_mode = both["mode"].iloc[0]
    ctx.headline(f"compiled model ({compile_scope}), {first_mode} speed-up (range over sizes)",
                 ratio_span(both[both["mode"] == first_mode].speedup))
scopes = vanilla_vs_compiled[(vanilla_vs_compiled.status == "ok") & vanilla_vs_compiled["size"].isin(whole_model_sizes)]
if len(whole_model_sizes) and scopes.scope.nunique() == 2:
    text = ("Whole model against block by block (the whole-model compilations ran after the block-by-block sweep, so Inductor's "
            "on-disk cache may already have held some of their kernels): ")
    for size, g in scopes.groupby("size", sort=False):
        by = g.set_index(["scope", "mode"])
        text += f"**{size}** — " + "; ".join(
            f"{mode} {fmt_ms(by.loc[('model', mode)].compiled_ms)} whole, {fmt_ms(by.loc[('blocks', mode)].compiled_ms)} by blocks "
            f"(first call {by.loc[('model', mode)].compiled_first_call_s:.1f} s against {by.loc[('blocks', mode)].compiled_first_call_s:.1f} s)"
            for mode in g["mode"].unique()) + ". "
    ctx.md(text)
not_ok = vanilla_vs_compiled[vanilla_vs_compiled.status != "ok"]
if len(not_ok):
    ctx.md("Not timed (vanilla/compiled status): " + ", ".join(f"{r['size']} {r['mode']} {r.scope} ({r.status})" for _, r in not_ok.iterrows()) + ".")

# %% [markdown]
# ### Our best configuration against a production model
# Our fastest training step — bf16 autocast, compiled, the fastest of the attention implementations
# (FlashAttention-2 in Triton from notebook 09, or PyTorch's SDPA; ranked eagerly, since the
# compiler fuses what lies between the attention kernels, not the kernels themselves, and only the
# winner is compiled, with scope `compile_scope`) — against Hugging Face's `LlamaForCausalLM` with the same architecture (same
# sizes, untied head, no biases, SDPA attention, vocabulary 10,000, RoPE θ = 10,000, SwiGLU width
# d_ff), run eagerly as shipped, on the same batch, with the same loss and the same optimizer
# (`llama_optimizer`; the optimizer is not what is compared, and the last table of this part shows
# what the choice costs), in the same process. Where Llama is compiled too, the same compiler works
# on both models, with the same scope (block by block: each `LlamaDecoderLayer`). Model FLOPs utilisation divides the model FLOPs of a step (6·N·tokens plus the
# attention's 12·L·B·S²·d, see `accounting/flops.py`) by the step time and by the device's measured
# bf16 matmul ceiling (an 8192³ product).
#
# Every configuration compiles from a clean Dynamo state (`harness.compile_fresh`): the models of a
# sweep share one `forward`, and past Dynamo's recompile limit (8 cache entries) it would quietly
# run later configurations eagerly.
#

# %%
ceiling = measure_matmul_tflops(torch.bfloat16, n=8192 if ctx.device.type == "cuda" else 512, device=ctx.device)
if not transformers_available():
    ctx.not_run("Llama reference", "the transformers package is not installed here; our timings are shown alone")
llama_base = BenchmarkConfig(batch_size=compile_batch, warmup=compile_warmup, steps=compile_steps)
versus, candidates = best_versus_llama(llama_base, llama_sizes, llama_contexts, llama_attentions, optimizer=llama_optimizer,
                                       ceiling_tflops=ceiling, bar=llama_bar, compile=ctx.device.type == "cuda",
                                       compile_scope=compile_scope,
                                       llama_compiled=llama_compiled)
ctx.save_table(candidates.drop(columns=["warmup_times_ms", "step_times_ms"], errors="ignore"), "best_vs_llama_candidates", show=False)
ctx.save_table(versus, "best_vs_llama");


# %%
compiled_note = f"compiled ({compile_scope})" if ctx.device.type == "cuda" else "not compiled on this CPU"
failed = candidates[candidates.status == "failed"]
text = f"Measured bf16 matmul ceiling: {ceiling:,.3g} TFLOP/s; both models stepped by `{llama_optimizer}`. "
for _, r in versus.iterrows():
    text += f"**{r['size']}, context {r.context_length}**: ours ({r.best_attention}, bf16, {compiled_note}) {fmt_ms(r.ours_ms)}"
    if r.llama_status == "ok":
        text += (f", Llama {fmt_ms(r.llama_ms)}: ours / Llama {r.ratio:.2f}; MFU {100 * r.ours_mfu:.1f}% against "
                 f"{100 * r.llama_mfu:.1f}%")
        if "llama_compiled_ms" in r and r.llama_compiled_ms == r.llama_compiled_ms:  # compiled there, and it ran
            text += f"; Llama compiled {fmt_ms(r.llama_compiled_ms)}, ours / compiled Llama {r.ratio_vs_compiled:.2f}"
        text += ". "
    else:
        text += f", MFU {100 * r.ours_mfu:.1f}%; Llama {r.llama_status}. "
if ctx.device.type != "cuda":
    text += ("On a CPU the bf16 ceiling of a small product is no bound for the model's matmuls, so these MFU figures only "
             "exercise the computation. ")
if len(failed):
    text += "Candidates that did not run: " + "; ".join(f"{r['attention']} at {r['size']}/{r.context_length} ({r.error})" for _, r in failed.iterrows()) + "."
ctx.md(text)
judged = versus.dropna(subset=["ratio"])
if len(judged):
    ctx.headline(f"best step / Llama step (largest of {len(judged)})", round(float(judged.ratio.max()), 2), "×")

# %% [markdown]
# **Where each step's time goes.** One more profiled step of each model as it was timed: per phase,
# the host's wall time and the device's compute time (the kernels the phase launched). A phase whose
# wall time is well above its compute time waits on the host — Python and kernel launches — not on
# the device.
#

# %%
phases = step_phase_table(versus, candidates)
ctx.save_table(phases, "best_vs_llama_phases", show=False)
if len(phases):
    long = phases.melt(id_vars=["size", "context_length", "model", "phase"], value_vars=["wall_ms", "compute_ms"], var_name="time", value_name="ms")
    long["pair"] = long["size"] + ", context " + long.context_length.astype(str)
    grid = sns.catplot(data=long, x="phase", y="ms", hue="model", col="pair", row="time", kind="bar", height=2.8, aspect=1.1, sharey=False)
    grid.set_titles("{col_name}: {row_name}")
    ctx.save_figure(grid.figure, "best_vs_llama_phases")
    sums = phases[phases.phase != "optimizer"].groupby(["size", "context_length", "model"], sort=False)[["wall_ms", "compute_ms"]].sum()
    text = "Forward+backward, host wall time against device compute time: "
    for (size, context), g in sums.groupby(level=[0, 1], sort=False):
        text += f"**{size}, context {context}**: " + "; ".join(f"{m} {r.wall_ms:.0f} ms for {r.compute_ms:.0f} ms" for (_, _, m), r in g.iterrows()) + ". "
    ctx.md(text)


# %% [markdown]
# **What the optimizer costs.** The same step (our best configuration of the first pair, eager: the
# optimizer is not compiled either way) with each AdamW of `cs336_systems.optim`: ours as written in
# assignment 1 (a loop over parameter tensors, eight operators each), ours with the multi-tensor
# `torch._foreach_*` operators (the same arithmetic, a handful of launches), and PyTorch's fused
# single-kernel AdamW.
#

# %%
best_attention = versus.best_attention.dropna().iloc[0] if versus.best_attention.notna().any() else llama_attentions[0]
optimizer_config = replace(llama_base, size=llama_sizes[0], context_length=llama_contexts[0], precision="bf16", attention=best_attention)
optimizers = optimizer_comparison(optimizer_config)
ctx.save_table(optimizers, "optimizer_comparison")
ran = optimizers[optimizers.status == "ok"]
ctx.md(f"{llama_sizes[0]}, context {llama_contexts[0]}, bf16, {best_attention}: " + "; ".join(
    f"`{r.optimizer}` step {fmt_ms(r.mean_ms)}, optimizer phase {r.optimizer_wall_ms:.1f} ms of host time for {r.optimizer_compute_ms:.1f} ms of compute"
    for r in ran.itertuples()) + ".")


# %% [markdown]
# **Why compiling helps, and where it cannot.** Most of a step's FLOPs are in matmuls that are
# already cuBLAS calls in the vanilla model, so compilation cannot speed them up; what it removes is
# the memory traffic and launch overhead of the many small elementwise and reduction kernels between
# them, which it fuses. So what compiling can save is the share of the step spent outside the
# matmuls, which the speed-ups above measure per size and pass. The Llama reference pays the
# elementwise cost eagerly, which is the margin a compiled, fused implementation can win.
