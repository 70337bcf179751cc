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
# # Problem `mixed_precision_accumulation` — summing 0.01 a thousand times
#
# Spring 2025 handout §1.1.5. The handout's four loops add 0.01 to an accumulator 1000 times; the
# exact answer is 10. Three bf16 variants are added for comparison.

# %% tags=["parameters"]
profile = None   # "cpu" or "gpu", the experiment runs on the CPU in both
n = 1000
value = 0.01

# %%
from cs336_systems.report import setup_notebook

ctx = setup_notebook("03_mixed_precision_accumulation", profile=profile)

# %%
import inspect

import torch

from cs336_systems.experiments.answers import give
from cs336_systems.experiments.mixed_precision import accumulate, accumulation_table, spacing

print(inspect.getsource(accumulate))
table = accumulation_table(n=n, value=value)
ctx.save_table(table, "accumulation", precision=6);

# %%
give(ctx, "mixed_precision_accumulation")

# %% [markdown]
# Each case in detail, the bf16 variants included:

# %%
exact = n * value
r = {(row.accumulator, row.addend, row.explicit_upcast): row for row in table.itertuples()}
fp32, fp16, mixed, bf16, bf16_mixed = r[("fp32", "fp32", False)], r[("fp16", "fp16", False)], r[("fp32", "fp16", False)], r[("bf16", "bf16", False)], r[("fp32", "bf16", False)]
ctx.md(
    f"**fp32 throughout** gives {fp32.result:.6f} (error {fp32.abs_error:.1e}): 0.01 has no exact binary form "
    f"(fp32 stores {fp32.addend_as_stored:.10f}), and each of the {n} additions rounds to fp32's spacing near 10 "
    f"({fp32.accumulator_spacing_at_result:.1e}), so small errors accumulate but stay tiny.\n\n"
    f"**fp16 throughout** gives {fp16.result:.6f}, off by {fp16.abs_error:.3f}: near 10 the spacing of fp16 numbers is "
    f"{fp16.accumulator_spacing_at_result:.4g}, comparable to the addend itself, so every addition rounds by a large "
    f"fraction of 0.01 — the accumulator, not the addend, is the problem.\n\n"
    f"**fp32 accumulator, fp16 addend** gives {mixed.result:.6f} whether the addend is upcast implicitly or explicitly "
    f"(type promotion does the same cast): the whole error, {mixed.abs_error:.2e}, is {n} × the fp16 rounding of 0.01 "
    f"({mixed.addend_rounding_error:+.2e} each).\n\n"
    f"**bf16**: with a bf16 accumulator the sum stalls at {bf16.result:g} — there bf16's spacing is "
    f"{spacing(bf16.result, torch.bfloat16):g}, "
    f"more than twice 0.01, so each addition rounds back to the same number; with an fp32 accumulator bf16 addends give "
    f"{bf16_mixed.result:.6f} (bf16 stores 0.01 as {bf16_mixed.addend_as_stored:.8f}).\n\n"
    "Lesson: keep accumulations (sums, reductions, the master weights an optimizer adds small updates to) in fp32 "
    "even when the operands are low precision — which is what autocast and tensor-core matmuls (fp32 accumulators) do."
)
ctx.headline("fp16 accumulation error (sum of 1000 × 0.01)", round(fp16.abs_error, 4))
ctx.headline("bf16 accumulation stalls at", bf16.result)
