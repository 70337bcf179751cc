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
# # Problems `alternate_ring_all_reduce` … `fsdp_tp_calcs` — when does each parallelism strategy become communication bound?
# Spring 2026 handout §8. One FFN, x1 = x W1, x2 = x W2, z = f(x1) * x2, y = z W3 with x: (B, D),
# W1, W2: (D, D_FF), W3: (D_FF, D), FP16 weights and activations (2 bytes), devices of C FLOP/s with W
# bytes/s of egress bandwidth, ring collectives. A strategy is communication bound once its communication
# time exceeds its compute time (the two overlap).
#
# Every formula below is produced by sympy from the library's cost functions
# (`cs336_systems.accounting.rings`, `.parallelism`), and the same functions give the numbers of a worked
# example. The formulas are then checked: the ring algorithms are simulated step by step on in-process
# "devices", the tensor-parallel backward pass is run against autograd, and the FLOP counts are compared
# with `torch.utils.flop_counter.FlopCounterMode` on a small FFN. Analytic, so the same in both profiles.

# %% tags=["parameters"]
profile = None                     # "cpu" | "gpu"; None picks gpu when CUDA is available
batch_tokens = 1_048_576           # B of the worked example (tokens); D and D_FF are the XXL model's
n_devices = 8                      # N of the per-device examples of the rings, DP, FSDP and TP
grid = (64, 8)                     # (N_FSDP, N_TP) of the per-device FSDP × TP example
ring_sizes = [2, 3, 4, 5, 6, 7, 8]  # device counts the ring simulation runs
ring_numel = 840                   # float64 values per device in the ring simulation (divisible by each N)
flop_check = dict(batch=24, d_model=16, d_ff=48)  # the small FFN the FLOP counter runs
flop_check_devices = [2, 4]        # N of the per-device FLOP checks

# %%
from dataclasses import asdict

import matplotlib.pyplot as plt
import pandas as pd
import sympy as sp

from cs336_systems.accounting.ffn_stack import H100, XXL
from cs336_systems.accounting.parallelism import (
    D_FF,
    B,
    C,
    D,
    W,
    best_fsdp_tp_split,
    ffn_weight_bytes,
    fsdp_tp_max_devices_overlapped,
    fsdp_tp_max_devices_shared,
    fsdp_tp_split_table,
    leading_term,
)
from cs336_systems.accounting.parallelism_answers import Example, answers_markdown, parallelism_answers
from cs336_systems.accounting.rings import ring_simulation_table
from cs336_systems.accounting.sharded_ffn import flop_check_table, tensor_parallel_check
from cs336_systems.accounting.symbolic import latex_equation
from cs336_systems.experiments.answers import give
from cs336_systems.report import setup_notebook

ctx = setup_notebook("19_parallelism_calcs", profile=profile)

# %%
example = Example(batch=batch_tokens, d_model=XXL.d_model, d_ff=XXL.d_ff, n_devices=n_devices, n_fsdp=grid[0],
                  n_tp=grid[1], flops_per_s=H100.flops_per_s, bandwidth=H100.bandwidth,
                  ring_bytes=ffn_weight_bytes(XXL.d_model, XXL.d_ff))
answers = parallelism_answers(example)
ctx.save_json(asdict(example), "parallelism_example")
summary = answers.assign(formula=answers.formula.map(sp.sstr))[["problem", "part", "quantity", "relation", "formula", "value", "unit"]]
ctx.save_table(summary.assign(relation=summary.relation.map({"=": "=", r"\le": "≤"})), "parallelism_answers", show=False)
ctx.md(f"**Worked example.** B = {example.batch:,} tokens, D = {example.d_model:,}, D_FF = {example.d_ff:,} (the "
       f"FFN of the XXL model), on {H100.name} data-sheet numbers: C = {example.flops_per_s:.3g} FLOP/s, "
       f"W = {example.bandwidth / 1e9:.0f} GB/s of NVLink egress. Per-device quantities at N = {example.n_devices} "
       f"(FSDP × TP: {example.n_fsdp} × {example.n_tp}); the rings move S = 6 D D_FF bytes = "
       f"{example.ring_bytes / 1e9:.2f} GB, the FFN's FP16 gradients.")

# %% [markdown]
# ## 8.1 `alternate_ring_all_reduce`
# In the alternate algorithm every device forwards a whole input x^(i) of S bytes in each of the N − 1
# steps, where the reduce-scatter + all-gather ring only ever forwards chunks of S/N bytes; the steps are
# synchronous and each device sends at W bytes/s, so the time is (N − 1) S / W, N/2 times the usual ring.

# %%
give(ctx, "alternate_ring_all_reduce")

# %%
rings = ring_simulation_table(ring_sizes, ring_numel, bandwidth=example.bandwidth)
rings["relative_difference"] = (rings.simulated_time_s / rings.closed_form_time_s - 1).abs()
ctx.save_table(rings, "ring_simulation")
ctx.md(f"Simulated on N = {min(ring_sizes)}..{max(ring_sizes)} in-process devices ({ring_numel} float64 values "
       f"each, bytes counted per step): every device ends with the true concatenation or sum (largest error "
       f"{rings.max_abs_error.max():.1e}) and the simulated time matches the closed form to a relative "
       f"{rings.relative_difference.max():.1e} for all {len(rings)} (collective, N) pairs.")

# %%
fig, ax = plt.subplots(figsize=(6, 3.8))
styles = zip(["C0", "C1", "C2", "C4"], ["--", ":", "-", "-"], ["o", "s", "^", "D"])
for (name, group), (color, line, marker) in zip(rings.groupby("collective", sort=False), styles):
    normalized = group.S_bytes / example.bandwidth
    ax.plot(group.N, group.closed_form_time_s / normalized, line, color=color, label=name)
    ax.plot(group.N, group.simulated_time_s / normalized, marker, color=color, mfc="none", ms=8)
ax.set(xlabel="devices N", ylabel="time / (S / W)", title="Ring collectives: simulated (markers) vs closed form (lines)")
ax.legend(fontsize=8)
ctx.save_figure(fig, "ring_collectives")
ctx.headline(f"alternate / ring all-reduce time at N={n_devices}",
             float(answers.set_index("quantity").loc["over the ring all-reduce", "value"]), unit="×")

# %% [markdown]
# ## 8.2 `data_parallel_calcs`
# (a) Each device runs the ordinary backward pass on its B/N_DP rows: six matmuls of 2 (B/N_DP) D D_FF FLOPs
# (dz, dx1 W1ᵀ, dx2 W2ᵀ, dW3, dW2, dW1). (b) The only communication is the ring all-reduce of the three
# gradient matrices, 6 D D_FF bytes, whatever the batch. (c) Compute falls as 1/N_DP while the all-reduce
# tends to a constant, so the limit is where they meet — N_DP is bounded by the tokens per step times W/C.

# %%
give(ctx, "data_parallel_calcs.a", "data_parallel_calcs.b", "data_parallel_calcs.c")
n_dp_limit = answers.query("problem == 'data_parallel_calcs' and part == 'c'").value.iloc[0]
ctx.headline("largest N_DP at the worked example", round(float(n_dp_limit), 1), unit="devices")

# %% [markdown]
# ## 8.3 `fsdp_calcs`
# (a) FSDP computes exactly what DP computes on its B/N_FSDP rows (after gathering the weights): 12 and 6
# B D D_FF / N_FSDP. (b) The forward pass all-gathers W1, W2, W3 (6 D D_FF bytes); the backward pass
# all-gathers them again and reduce-scatters the gradients, each of those a half of an all-reduce.
# (c) Backward doubles both the FLOPs and the communication of the forward pass, so both passes hit the
# same limit as DP.

# %%
give(ctx, "fsdp_calcs.a", "fsdp_calcs.b", "fsdp_calcs.c")

# %% [markdown]
# ## 8.4 `tp_calcs`
# **(a) The backward pass.** Every device i holds the full dy (B, D) (y was all-reduced) and its shards
# W1^(i), W2^(i): (D, D_FF/N_TP), W3^(i): (D_FF/N_TP, D), with x, x1^(i), x2^(i), z^(i) saved from the forward:
#
# $$ dz^{(i)} = dy\, W_3^{(i)\top} \qquad (B, D_{FF}/N_{TP}) $$
# $$ dx_2^{(i)} = dz^{(i)} * f(x_1^{(i)}), \qquad dx_1^{(i)} = dz^{(i)} * f'(x_1^{(i)}) * x_2^{(i)} $$
# $$ dW_3^{(i)} = z^{(i)\top} dy, \qquad dW_2^{(i)} = x^\top dx_2^{(i)}, \qquad dW_1^{(i)} = x^\top dx_1^{(i)} $$
# $$ dx = \text{all-reduce}\big(\{dx_1^{(i)} W_1^{(i)\top} + dx_2^{(i)} W_2^{(i)\top}\}_{i=0}^{N_{TP}-1}\big) \qquad (B, D) $$
#
# The weight gradients need no communication (each device owns its shard); dx needs the all-reduce
# because each device's contribution covers only its D_FF/N_TP hidden units. The library runs exactly
# these equations shard by shard (`tensor_parallel_ffn_backward`, the all-reduce by the simulated ring);
# against autograd on the unsharded FFN, in float64:

# %%
tp_check = tensor_parallel_check(flop_check["batch"], flop_check["d_model"], flop_check["d_ff"], max(flop_check_devices))
ctx.save_table(tp_check, "tensor_parallel_vs_autograd")
give(ctx, "tp_calcs.a")

# %% [markdown]
# (b) Each device runs the whole batch through D_FF/N_TP hidden units: the forward pass's three matmuls
# and the backward pass's six all shrink by N_TP. (c) Each pass has one all-reduce of a (B, D) activation
# (y forward, dx backward), 2 B D bytes, independent of D_FF. (d) Compute per device falls as 1/N_TP while
# the all-reduce grows towards 4 B D / W, and the batch cancels: the limit depends only on D_FF W / C; the
# forward pass, with half the FLOPs for the same all-reduce, hits it first.

# %%
give(ctx, "tp_calcs.b", "tp_calcs.c", "tp_calcs.d")

# %% [markdown]
# ## 8.5 `fsdp_tp_calcs`
# (a) Device (i, j) runs B/N_FSDP rows through D_FF/N_TP hidden units. (b) Along the FSDP axis it
# all-gathers its TP shards of the three weights (6 D D_FF / N_TP bytes); along the TP axis it all-reduces
# y^(i,j), (B/N_FSDP, D); the two overlap, so the time is the larger.

# %%
give(ctx, "fsdp_tp_calcs.a", "fsdp_tp_calcs.b", "fsdp_tp_calcs.c", "fsdp_tp_calcs.d")

# %% [markdown]
# (c) With the axes overlapped, compute must beat each collective on its own. In the FSDP condition the
# N_TP cancels and in the TP condition the N_FSDP cancels, so each axis has its own limit — the DP/FSDP
# limit and the TP forward limit — and the best grid takes both at their limits; N is their product.
# (d) If the collectives share the network, their times add. Multiplying T_FSDP + T_TP ≤ T_compute by
# N_FSDP N_TP W / (2D) gives a linear budget, 3 D_FF (N_FSDP − 1) + 2 B (N_TP − 1) ≤ 3 B D_FF W / C, and a
# product under a linear budget is largest when the two terms are equal (Lagrange); sympy solves it:

# %%
n_fsdp_o, n_tp_o, _ = fsdp_tp_max_devices_overlapped(B, D, D_FF, C, W)
n_fsdp_s, n_tp_s, n_s = fsdp_tp_max_devices_shared(B, D, D_FF, C, W)
limits = answers.query("problem == 'fsdp_tp_calcs'").set_index("part")
n_o = limits.loc["c", "formula"]
ctx.md("\n\n".join([
    "**(c) axes overlapped:**",
    latex_equation("N_{FSDP}", n_fsdp_o, r"\le"), latex_equation("N_{TP}", n_tp_o, r"\le"),
    latex_equation(r"N = N_{FSDP} N_{TP}", n_o, r"\le"), latex_equation(r"\approx", leading_term(n_o), ""),
    "**(d) axes sharing the network:** at the optimum",
    latex_equation("N_{FSDP}^*", n_fsdp_s), latex_equation("N_{TP}^*", n_tp_s),
    latex_equation("N", n_s, r"\le"), latex_equation(r"\approx", leading_term(n_s), ""),
    "where ≈ keeps the leading term when W/C is large (every (N−1)/N ≈ 1): sharing the network costs a factor "
    f"{sp.simplify(leading_term(n_o) / leading_term(n_s))} in devices.",
]))

# %%
splits = fsdp_tp_split_table(example.batch, example.d_model, example.d_ff, example.flops_per_s, example.bandwidth)
ctx.save_table(splits, "fsdp_tp_integer_splits", show=False)
best = {kind: best_fsdp_tp_split(example.batch, example.d_model, example.d_ff, example.flops_per_s,
                                 example.bandwidth, overlapped=kind == "overlapped") for kind in ("overlapped", "shared")}
fig, ax = plt.subplots(figsize=(6, 3.8))
for kind in ("overlapped", "shared"):
    ax.plot(splits.n_tp, splits[f"n_{kind}"], marker=".", label=f"axes {kind}")
    ax.plot(best[kind]["n_tp"], best[kind]["n"], "k*", ms=10)
ax.set(yscale="log", xlabel="N_TP", ylabel="largest compute-bound N = N_FSDP · N_TP",
       title="FSDP × TP forward pass at the worked example (★ = best split)")
ax.legend(fontsize=8)
ctx.save_figure(fig, "fsdp_tp_splits")
ctx.md(f"At the worked example the best integer grids are **{best['overlapped']['n_fsdp']} × "
       f"{best['overlapped']['n_tp']} = {best['overlapped']['n']:,} devices** with overlapped axes and "
       f"**{best['shared']['n_fsdp']} × {best['shared']['n_tp']} = {best['shared']['n']:,}** with a shared network "
       f"(the real-valued limits are {limits.loc['c', 'value']:,.0f} and {limits.loc['d', 'value']:,.0f}).")
ctx.headline("FSDP×TP devices, axes overlapped (worked example)", best["overlapped"]["n"], unit="devices")
ctx.headline("FSDP×TP devices, shared network (worked example)", best["shared"]["n"], unit="devices")

# %% [markdown]
# ## Checking the FLOP formulas
# Each device of each strategy runs its own shard of a small FFN (DP and FSDP: B/N rows with all the
# weights; TP: all rows with D_FF/N hidden units; FSDP × TP: B/N rows and D_FF/N units on an N × N grid)
# under `FlopCounterMode`, forward and backward through autograd:

# %%
flops = pd.concat([flop_check_table(**flop_check, n=n).assign(N=n) for n in flop_check_devices], ignore_index=True)
flops["match"] = flops.counted == flops.formula
ctx.save_table(flops, "flop_counter_check")
ctx.md(f"Counted and formula FLOPs agree in {flops.match.sum()} of {len(flops)} cases "
       f"(B = {flop_check['batch']}, D = {flop_check['d_model']}, D_FF = {flop_check['d_ff']}, N = "
       f"{', '.join(map(str, flop_check_devices))}).")

# %% [markdown]
# ## All answers, as formulas

# %%
ctx.md("\n\n".join(answers_markdown(answers, problem) for problem in answers.problem.unique()))
