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
# # Problem `communication_accounting` — memory and communication of the XXL model
# Spring 2025 handout §2.4. The XXL model has `d_model` = 16384, `d_ff` = 53248 and 126 blocks, each
# only two linear layers (d_model → d_ff → d_model; attention, embeddings, the output layer and the
# activation function are left out). Activations and gradient communication are BF16; master weights,
# accumulated gradients and the AdamW state are FP32. We price (a) its memory, (b) its memory per device
# under FSDP, (c) the batch at which an FSDP × TP mesh of TPU v5p is compute bound in the forward pass,
# and (d) the tricks that lower that batch.
#
# Everything here is analytic (`cs336_systems.accounting`), so the notebook is the same in both profiles.
# Units: **GB = 10⁹ bytes**, **GiB = 2³⁰ bytes**; batch sizes are in tokens.

# %% tags=["parameters"]
profile = None                                  # "cpu" | "gpu"; None picks gpu when CUDA is available
activation_tokens = [1, 2_048, 1_048_576]       # batches (tokens) to price the saved activations at
fsdp_tokens = [0, 1_024, 2_048, 4_096, 8_192]   # batches (tokens) for the N_FSDP needed to fit a v5p
comparison_tokens = 2_048                       # batch (tokens) of the DP / FSDP / TP memory comparison

# %%
import math

import matplotlib.pyplot as plt
import pandas as pd
import sympy as sp

from cs336_systems.accounting.ffn_stack import (
    GB,
    H100,
    TPU_V5P,
    XXL,
    FFNStack,
    devices_table,
    fsdp_devices_to_fit,
    fsdp_fit_table,
    fsdp_memory_per_device,
    stack_memory_per_device,
    stack_saved_activation_bytes,
    training_state_bytes,
    training_state_table,
)
from cs336_systems.accounting.mesh import (
    mesh_batch_table,
    mesh_best_split,
    mesh_forward_times,
    mesh_max_tp,
    mesh_min_batch,
    mesh_times_table,
)
from cs336_systems.accounting.symbolic import latex_equation
from cs336_systems.experiments.answers import give
from cs336_systems.report import setup_notebook

ctx = setup_notebook("18_communication_accounting", profile=profile)

# %% [markdown]
# ## (a) Training state and saved-for-backward memory
# Each block holds W_in (D × F) and W_out (F × D), so P = 2 D F L parameters. Mixed-precision AdamW keeps
# four FP32 tensors of P values: master weights, accumulated gradients, and the two moments.

# %%
D, F, L, T = sp.symbols("D F L T", positive=True)
ctx.md(latex_equation("P", sp.Mul(2, D, F, L, evaluate=False))
       + f"\n\nWith D = {XXL.d_model:,}, F = {XXL.d_ff:,}, L = {XXL.num_blocks}: **P = {XXL.num_parameters:,} parameters**.")
state = training_state_table(XXL)
ctx.save_table(state, "xxl_training_state", precision=2)
total_state = sum(training_state_bytes(XXL).values())

# %% [markdown]
# Without activation checkpointing, autograd keeps the input of every linear layer for its weight
# gradient: x (D values per token) for W_in and x W_in (F values per token) for W_out, in BF16.

# %%
per_token = stack_saved_activation_bytes(XXL, 1)
ctx.md(latex_equation(r"A(T)", stack_saved_activation_bytes(FFNStack(D, F, L), T))
       + f"\n\nThat is **{per_token:,.0f} bytes = {per_token / 1e6:.2f} MB ({per_token / 2**20:.2f} MiB) per token**.")
sizes = {"FP32 master weights + gradients + AdamW state": total_state}
sizes |= {f"BF16 saved activations, {t:,} tokens": stack_saved_activation_bytes(XXL, t) for t in activation_tokens}
sizes |= {f"state + activations, {t:,} tokens": total_state + stack_saved_activation_bytes(XXL, t) for t in activation_tokens}
h100 = devices_table(sizes, H100)
ctx.save_table(h100, "xxl_memory_in_h100s", precision=2)
state_row = h100.iloc[0]
give(ctx, "communication_accounting.a")
ctx.headline("XXL parameters", XXL.num_parameters)
ctx.headline("XXL FP32 weights + grads + AdamW", round(state_row.GB, 2), unit="GB")

# %% [markdown]
# ## (b) Sharding over N_FSDP devices
# The training state S and half of the saved activations A (every second layer) are split over N_FSDP
# devices; the other half of the activations stays whole on every device:

# %%
S, A, M, N = sp.symbols("S A M N_FSDP", positive=True)
ctx.md(latex_equation(r"M_{\mathrm{device}}", fsdp_memory_per_device(S, A, N, sp.S.Half))
       + "\n\nso it fits in a device of M bytes when\n\n"
       + latex_equation("N_{FSDP}", fsdp_devices_to_fit(S, A, M, sp.S.Half), r"\ge"))
n_state_only = fsdp_devices_to_fit(total_state, 0, TPU_V5P.memory_bytes)
fit = fsdp_fit_table(XXL, fsdp_tokens, TPU_V5P).astype({"min_N_FSDP": "Int64"})
ctx.save_table(fit, "xxl_fsdp_devices_to_fit_v5p", precision=2)
n_fsdp = math.floor(n_state_only) + 1
give(ctx, "communication_accounting.b")
ctx.headline("N_FSDP to fit a 95 GB v5p", n_fsdp, unit="devices")

# %% [markdown]
# For comparison, the three one-dimensional strategies on the same number of devices (DP replicates the
# state and splits the batch; FSDP splits both; TP splits the state and the F side of the activations,
# but every device sees the whole batch):

# %%
compare = [dict(strategy=s, devices=n_fsdp, tokens=comparison_tokens,
                GB_per_device=stack_memory_per_device(XXL, comparison_tokens, s, n_fsdp) / GB) for s in ("DP", "FSDP", "TP")]
comparison = ctx.save_table(pd.DataFrame(compare), "xxl_memory_per_device_by_strategy", precision=2)

# %% [markdown]
# ## (c) When is the forward pass compute bound on an X × Y mesh?
# In the TPU Scaling Book's notation (part 5, "FSDP + tensor parallelism"), with B tokens, N = X Y chips,
# the weights' Y-shards all-gathered over the FSDP axis X (spanning M_X hardware axes) and the activations
# all-gathered / reduce-scattered over the TP axis Y (spanning M_Y axes), one block's forward pass costs:

# %%
Bs, X, Y, C, Wici, MX, MY = sp.symbols("B X Y C W_ici M_X M_Y", positive=True)
times = mesh_forward_times(Bs, D, F, X, Y, C, Wici, MX, MY)
ctx.md("\n\n".join(latex_equation(rf"T_{{\mathrm{{{k}}}}}", v) for k, v in times.items()))
ctx.md("Compute bound needs T_math ≥ T_FSDP, a condition on the batch, and T_math ≥ T_TP, a condition on Y alone:\n\n"
       + latex_equation("B", mesh_min_batch(D, F, X, Y, C, Wici, MX, MY), r"\ge") + "\n\n"
       + latex_equation("Y", mesh_max_tp(F, C, Wici, MY), r"\le"))

# %%
mesh = dict(x=16, y=4, m_x=2, m_y=1)
chip = TPU_V5P
batch = mesh_min_batch(XXL.d_model, XXL.d_ff, mesh["x"], mesh["y"], chip.flops_per_s, chip.bandwidth, mesh["m_x"], mesh["m_y"])
chips = mesh["x"] * mesh["y"]
per_chip = math.ceil(batch / chips)
ctx.headline("v5p 16x4 mesh: compute-bound batch per chip", per_chip, unit="tokens")
ctx.headline("v5p 16x4 mesh: compute-bound global batch", per_chip * chips, unit="tokens")

# %%
sweep = mesh_times_table(XXL.d_model, XXL.d_ff, mesh["x"], mesh["y"], chip.flops_per_s, chip.bandwidth,
                         mesh["m_x"], mesh["m_y"], batches=[2**k for k in range(10, 19)])
ctx.save_table(sweep, "xxl_mesh_forward_times", show=False)
fig, ax = plt.subplots(figsize=(6, 3.8))
for column, label in [("math", "T_math (compute)"), ("fsdp", "T_FSDP (weight all-gathers)"), ("tp", "T_TP (activation collectives)")]:
    ax.plot(sweep.batch, sweep[column] * 1e3, marker="o", label=label)
ax.axvline(batch, color="gray", ls="--", label=f"compute bound from B = {batch:,.0f}")
ax.set(xscale="log", yscale="log", xlabel="global batch B (tokens)", ylabel="time per block, forward (ms)",
       title=f"XXL on a {mesh['x']} × {mesh['y']} TPU v5p mesh")
ax.legend(fontsize=8)
ctx.save_figure(fig, "xxl_mesh_forward_times")
give(ctx, "communication_accounting.c")

# %% [markdown]
# ## (d) Lowering the batch while staying compute bound
# The FSDP condition B ≥ X · (bytes/2) · C / (M_X W_ici) says the batch has to cover the weight traffic of
# the FSDP axis, while the TP condition Y ≤ M_Y F W_ici / C caps how much of the mesh TP can take. So:
# shrink the FSDP axis (give the chips to TP, or to pipeline stages, whose communication is only the
# activations at stage boundaries), spread the FSDP axis over more hardware axes (larger M_X), and send
# fewer bytes per weight (FP8 all-gathers). The table prices layouts of the same 64 chips (a 4 × 4 × 4 v5p
# torus); below it, the best real-valued split, which makes TP as wide as its limit.

# %%
layouts = [
    dict(name="handout: FSDP 16 (2 axes) × TP 4", x=16, y=4, m_x=2, m_y=1),
    dict(name="same, FP8 weight all-gathers", x=16, y=4, m_x=2, m_y=1, bytes_per_value=1),
    dict(name="FSDP 4 × TP 16 (2 axes)", x=4, y=16, m_x=1, m_y=2),
    dict(name="FSDP 4 × TP 16 (2 axes), FP8 all-gathers", x=4, y=16, m_x=1, m_y=2, bytes_per_value=1),
    dict(name="pure FSDP 64 (3 axes)", x=64, y=1, m_x=3, m_y=1),
    dict(name="pure TP 64 (3 axes)", x=1, y=64, m_x=1, m_y=3),
    dict(name="4 pipeline stages of FSDP 4 × TP 4", x=4, y=4, m_x=1, m_y=1, stages=4),
]
options = mesh_batch_table(XXL.d_model, XXL.d_ff, chip.flops_per_s, chip.bandwidth, layouts)
best = mesh_best_split(chips, XXL.d_ff, chip.flops_per_s, chip.bandwidth, 2, 1)
ctx.save_table(options, "xxl_batch_lowering_layouts", precision=1)
best_symbolic = mesh_best_split(sp.Symbol("N", positive=True), F, C, Wici, MX, MY)
ctx.md("\n\n".join(latex_equation(lhs, best_symbolic[k]) for lhs, k in [("X^*", "x"), ("Y^*", "y"), ("B_{min}", "batch")])
       + f"\n\nFor {chips} chips with M_X = 2, M_Y = 1: X* = {best['x']:.2f}, Y* = {best['y']:.2f}, "
       f"B_min = {best['batch']:,.0f} tokens ({best['batch'] / chips:.1f} per chip).")

# %%
row = options.set_index("layout")
base = row.iloc[0].min_global_batch
tp16 = row.loc["FSDP 4 × TP 16 (2 axes)"]
give(ctx, "communication_accounting.d")
