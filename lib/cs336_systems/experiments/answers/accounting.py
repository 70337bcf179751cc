"""Answers of the accounting problems: communication_accounting (2025, notebook 18) and the parallelism
calculations of 2026 (notebook 19). The quantities are analytic, so the text is computed from the same
library functions the notebooks call; the support tables are the notebooks' own."""

from __future__ import annotations

import math

import pandas as pd

from cs336_systems.accounting.ffn_stack import (
    GB,
    H100,
    TPU_V5P,
    XXL,
    fsdp_devices_to_fit,
    fsdp_memory_per_device,
    stack_saved_activation_bytes,
    training_state_bytes,
)
from cs336_systems.accounting.mesh import mesh_best_split, mesh_max_tp, mesh_min_batch
from cs336_systems.experiments.answers import NotAnswered, Results, builds
from cs336_systems.report.answers import Answer

MESH = dict(x=16, y=4, m_x=2, m_y=1)  # the handout's FSDP 16 (two axes) x TP 4 mesh of TPU v5p


def _formula(text: str) -> str:
    """A sympy string as a reader writes it: `12·B·D·D_FF/N_DP`, `C²`."""
    return text.replace("**2", "²").replace("*", "·")


@builds("communication_accounting.a")
def xxl_memory(results: Results) -> Answer:
    state = sum(training_state_bytes(XXL).values())
    per_token = stack_saved_activation_bytes(XXL, 1)
    table = results.table("xxl_memory_in_h100s").rename(
        columns={"quantity": "memory", "GB": "GB", "devices": "H100s (80 GB)"}
    )
    return Answer(
        f"The XXL stack has P = 2·D·F·L = **{XXL.num_parameters:,} parameters**; FP32 master weights, accumulated "
        f"gradients and the two AdamW moments (16 bytes per parameter) take **{state / GB:,.1f} GB**, the memory of "
        f"**{state / H100.memory_bytes:.1f} H100s** of {H100.memory_bytes / GB:.0f} GB. Saving each linear layer's "
        f"input in BF16 for backward adds 2·(D + F)·L bytes = **{per_token / 1e6:.2f} MB per token** of the batch.",
        table=table[["memory", "GB", "H100s (80 GB)"]],
    )


@builds("communication_accounting.b")
def xxl_fsdp_fit(results: Results) -> Answer:
    state = sum(training_state_bytes(XXL).values())
    per_token = stack_saved_activation_bytes(XXL, 1)
    n_min = fsdp_devices_to_fit(state, 0, TPU_V5P.memory_bytes)
    n = math.floor(n_min) + 1
    table = results.table("xxl_fsdp_devices_to_fit_v5p").rename(
        columns={
            "tokens": "batch (tokens)",
            "activations_GB": "activations (GB)",
            "min_N_FSDP": "smallest N_FSDP",
            "per_device_GB": "GB per device",
        }
    )
    return Answer(
        f"Per device, M = S / N_FSDP + A / (2·N_FSDP) + A / 2, with S = {state / GB:,.1f} GB of training state and A "
        f"the saved activations (half of them sharded). With A small, S / N_FSDP < {TPU_V5P.memory_bytes / GB:.0f} GB "
        f"needs N_FSDP > {n_min:.2f}: **N_FSDP = {n}** ({fsdp_memory_per_device(state, 0, n) / GB:.1f} GB per device). "
        f"Each token adds {per_token / 2 / 1e6:.2f} MB that sharding cannot remove, so no N_FSDP fits past "
        f"{2 * TPU_V5P.memory_bytes / per_token:,.0f} tokens.",
        table=table,
    )


@builds("communication_accounting.c")
def xxl_mesh_batch(results: Results) -> Answer:
    chip = TPU_V5P
    batch = mesh_min_batch(
        XXL.d_model, XXL.d_ff, MESH["x"], MESH["y"], chip.flops_per_s, chip.bandwidth, MESH["m_x"], MESH["m_y"]
    )
    y_max = mesh_max_tp(XXL.d_ff, chip.flops_per_s, chip.bandwidth, MESH["m_y"])
    chips = MESH["x"] * MESH["y"]
    per_chip = math.ceil(batch / chips)
    return Answer(
        f"A block's forward is compute bound when its math time beats both collectives: the TP condition "
        f"Y ≤ M_Y·F·W_ici / C = {y_max:.1f} holds for Y = {MESH['y']}, and the FSDP condition needs "
        f"B ≥ X·C / (M_X·W_ici) = {batch:,.0f} tokens (C / W_ici = {chip.flops_per_s / chip.bandwidth:,.0f}). So the "
        f"forward is compute bound from **{per_chip} tokens per chip**, a batch of **{per_chip * chips:,} tokens** "
        f"on the {MESH['x']} × {MESH['y']} = {chips} chips.",
        figure=results.figure("xxl_mesh_forward_times"),
    )


@builds("communication_accounting.d")
def xxl_batch_lowering(results: Results) -> Answer:
    layouts = results.table("xxl_batch_lowering_layouts").set_index("layout")
    base = layouts.iloc[0].min_global_batch
    tp16 = layouts.loc["FSDP 4 × TP 16 (2 axes)"]
    fp8 = layouts.loc["same, FP8 weight all-gathers"]
    chips = MESH["x"] * MESH["y"]
    best = mesh_best_split(chips, XXL.d_ff, TPU_V5P.flops_per_s, TPU_V5P.bandwidth, 2, 1)
    table = layouts.reset_index()[["layout", "min_global_batch", "min_batch_per_chip"]].rename(
        columns={"min_global_batch": "smallest compute-bound batch (tokens)", "min_batch_per_chip": "per chip"}
    )
    return Answer(
        f"The FSDP condition B ≥ X·(bytes per weight)·C / (2·M_X·W_ici) grows with the FSDP axis, so shrink it: "
        f"moving the 64 chips from FSDP 16 × TP 4 to FSDP 4 × TP 16 lowers the compute-bound batch from {base:,.0f} to "
        f"{tp16.min_global_batch:,.0f} tokens, and the best split (TP as wide as its limit) reaches "
        f"{best['batch']:,.0f} (the Scaling Book's bound, Austin et al., 2025). All-gathering weights in FP8 halves "
        f"the bound ({fp8.min_global_batch:,.0f} on the handout's mesh; torchao's float8 FSDP2 all-gathers, "
        f"DeepSeek-V3 2024); pipeline stages (GPipe, Huang et al. 2019; 1F1B, Narayanan et al. 2021) take chips off "
        f"the FSDP axis at the cost of activation sends and a bubble; keeping BF16 weights resident with sharded "
        f"state (ZeRO-1/2, Rajbhandari et al. 2020) removes the weight all-gathers altogether.",
        table=table,
    )


# Notebook 19: one short statement of the mechanism per part; the formulas and values come from the table.
CALCS_WHY = {
    "alternate_ring_all_reduce": "Every device forwards a whole input of S bytes in each of the N − 1 synchronous "
    "steps, where the usual ring forwards chunks of S/N.",
    "data_parallel_calcs.a": "Each device runs the whole backward on its B/N_DP rows: six matmuls of "
    "2·(B/N_DP)·D·D_FF FLOPs.",
    "data_parallel_calcs.b": "The only communication is the ring all-reduce of the FFN's gradients, 6·D·D_FF bytes "
    "whatever the batch.",
    "data_parallel_calcs.c": "Compute falls as 1/N_DP while the all-reduce tends to a constant, so N_DP is bounded "
    "where they meet.",
    "fsdp_calcs.a": "After gathering the weights each device computes what data parallelism computes on B/N_FSDP rows.",
    "fsdp_calcs.b": "The forward all-gathers the three weights; the backward gathers them again and reduce-scatters "
    "the gradients.",
    "fsdp_calcs.c": "The backward doubles both the FLOPs and the communication of the forward, so both passes "
    "meet the same limit.",
    "tp_calcs.b": "Each device runs the whole batch through D_FF/N_TP hidden units, in the forward's three matmuls "
    "and the backward's six.",
    "tp_calcs.c": "Each pass all-reduces one (B, D) activation, 2·B·D bytes (y forward, dx backward), independent "
    "of D_FF.",
    "tp_calcs.d": "Compute falls as 1/N_TP while the all-reduce does not, and the batch cancels; the forward, with "
    "half the FLOPs for the same all-reduce, hits the limit first.",
    "fsdp_tp_calcs.a": "Device (i, j) runs B/N_FSDP rows through D_FF/N_TP hidden units.",
    "fsdp_tp_calcs.b": "It all-gathers its TP shards of the weights over the FSDP axis and all-reduces its (B/N_FSDP, "
    "D) output over the TP axis; overlapped, the larger of the two counts.",
    "fsdp_tp_calcs.c": "Overlapped, compute must beat each collective alone, and each axis keeps its own limit; "
    "the best grid takes both at their limits.",
    "fsdp_tp_calcs.d": "Sharing the network, the two times add: a linear budget "
    "3·D_FF·(N_FSDP − 1) + 2·B·(N_TP − 1) ≤ 3·B·D_FF·W/C whose product N_FSDP·N_TP is largest "
    "with the two terms equal.",
}


def _calcs_rows(results: Results, key: str) -> pd.DataFrame:
    answers = results.table("parallelism_answers")
    problem, _, part = key.partition(".")
    rows = answers[(answers.problem == problem) & (answers.part.fillna("").astype(str) == part)]
    if rows.empty:
        raise NotAnswered(f"this run's parallelism table has no row for {key}")
    return rows


def _value(value: float, unit: str) -> str:
    if unit == "s":
        return f"{value * 1e3:,.2f} ms"
    if unit == "×":
        return f"{value:.4g}×"
    if unit == "FLOP":
        return f"{value:.3e} FLOP"
    return f"{value:,.4g} {unit}".strip()


def _calcs_answer(results: Results, key: str) -> Answer:
    rows = _calcs_rows(results, key)
    statements = "; ".join(
        f"{r.quantity}: `{_formula(str(r.formula))}` ({'=' if r.relation == '=' else '≤'} {_value(r.value, r.unit)} at "
        "the worked example)"
        for r in rows.itertuples()
    )
    return Answer(f"{CALCS_WHY[key]} {statements[0].upper()}{statements[1:]}.", caveat=_example(results))


def _example(results: Results) -> str:
    """The worked example's numbers, as notebook 19 saved them."""
    e = results.json("parallelism_example") if (results.folder / "parallelism_example.json").exists() else None
    if e is None:
        return "Values at notebook 19's worked example."
    return (
        f"Worked example: B = {e['batch']:,.0f} tokens, D = {e['d_model']:,}, D_FF = {e['d_ff']:,}, "
        f"C = {e['flops_per_s']:.3g} FLOP/s, W = {e['bandwidth'] / 1e9:,.0f} GB/s, N = {e['n_devices']} devices "
        f"(FSDP × TP: {e['n_fsdp']} × {e['n_tp']}), S = {e['ring_bytes'] / 1e9:,.2f} GB."
    )


def _register_calcs(key: str) -> None:
    builds(key)(lambda results, key=key: _calcs_answer(results, key))


for _key in CALCS_WHY:
    _register_calcs(_key)


@builds("tp_calcs.a")
def tensor_parallel_backward(results: Results) -> Answer:
    check = results.table("tensor_parallel_vs_autograd")
    return Answer(
        "Every device i holds the full dy (y was all-reduced) and its shards W1⁽ⁱ⁾, W2⁽ⁱ⁾ (D × D_FF/N_TP) and W3⁽ⁱ⁾ "
        "(D_FF/N_TP × D):\n\n"
        "```\ndz(i)  = dy · W3(i)ᵀ                         (B, D_FF/N_TP)\n"
        "dx2(i) = dz(i) ∗ f(x1(i));   dx1(i) = dz(i) ∗ f′(x1(i)) ∗ x2(i)\n"
        "dW3(i) = z(i)ᵀ · dy;   dW2(i) = xᵀ · dx2(i);   dW1(i) = xᵀ · dx1(i)      (no communication)\n"
        "dx     = all-reduce over i of  dx1(i) · W1(i)ᵀ + dx2(i) · W2(i)ᵀ        (B, D)\n```\n\n"
        f"The weight gradients stay on their shard's device; dx needs the one all-reduce. Run shard by shard against "
        f"autograd on the unsharded FFN in float64, y, dx and every weight gradient agree to "
        f"{check.max_abs_difference.max():.1e}.",
        table=check.rename(columns={"result": "tensor", "max_abs_difference": "largest |difference|"}),
    )
