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
# # Problems `flash_forward` and `flash_backward` — FlashAttention-2 in PyTorch and in Triton
# Spring 2025 handout §1.3.2–1.3.4. (a) A tiled FlashAttention-2 forward in plain PyTorch
# (Algorithm 1, tiles of at least 16×16) as a `torch.autograd.Function` that saves L, Q, K, V, O;
# (b) the same forward as one fused Triton kernel; (c) a causal flag; then the backward, from
# Q, K, V, O, dO and L with the D vector (equations 13–19): compiled PyTorch, and the optional
# Triton backward of §1.3.4 (Algorithm 2, two passes, no atomics). Below: the algorithm next to
# its code, a correctness table against a float64 reference, and memory against sequence length.

# %% tags=["parameters"]
profile = None            # cpu or gpu, None picks gpu when CUDA is available
memory_seq_lens = None    # sequence lengths of the memory sweep, None means the default of the profile
memory_d_model = 64       # head dimension of the memory sweep
memory_batch = 1
triton_tiles = None       # Q_TILE and K_TILE of the Triton kernels, None means per head dimension or 16 by 16 in the interpreter
compile_backward = None   # compile the PyTorch backward of the memory sweep, None means yes on GPU and no on CPU

# %%
import os

import torch

if not torch.cuda.is_available():
    # The Triton interpreter: the env var must be set before triton (the kernels) is first imported.
    os.environ["TRITON_INTERPRET"] = "1"

from cs336_systems.report import setup_notebook

ctx = setup_notebook("09_flash_attention", profile=profile)
memory_seq_lens = ctx.pick(memory_seq_lens, cpu=[64, 128, 256, 512], gpu=[1024, 2048, 4096, 8192, 16384, 32768, 65536])
triton_tiles = ctx.pick(triton_tiles, cpu=(16, 16), gpu=None)
compile_backward = ctx.pick(compile_backward, cpu=False, gpu=True)

# %%
import inspect

import matplotlib.pyplot as plt
import seaborn as sns

from cs336_systems.attention import FlashAttentionPytorch, FlashAttentionTriton
from cs336_systems.attention.api import DEFAULTS, flash_attention_triton
from cs336_systems.attention.kernels.triton_backward import flash_bwd_dkdv_kernel, flash_bwd_dq_kernel
from cs336_systems.attention.kernels.triton_forward import flash_fwd_kernel
from cs336_systems.attention.launch.layout import kernels_interpreted
from cs336_systems.attention.naive import naive_attention
from cs336_systems.attention.pytorch import flash_backward_reference, flash_forward_tiles
from cs336_systems.attention.reference import TOLERANCE
from cs336_systems.experiments.answers import give
from cs336_systems.experiments.attention_benchmark import accuracy_table, peak_memory_sweep, seq_len_axis

DEFAULTS.tiles = triton_tiles  # every call that names no tiles of its own
FlashAttentionPytorch.compile_backward = compile_backward
if kernels_interpreted():
    ctx.md("> The Triton kernels run in the **Triton interpreter** here (no GPU): the same kernel code, executed "
           "block by block with NumPy. It checks the indexing, masking and numerics, not the speed, so shapes stay small.")


def show_source(obj) -> None:
    ctx.md(f"```python\n{inspect.getsource(getattr(obj, 'fn', obj))}```")


# %% [markdown]
# ## The forward pass: Algorithm 1
# Q is split into query tiles Q_i of B_q rows, K and V into key tiles K⁽ʲ⁾, V⁽ʲ⁾ of B_k rows. For one
# query tile, with m⁽⁰⁾ = −∞, l⁽⁰⁾ = 0, O⁽⁰⁾ = 0, each key tile j updates a running row maximum m,
# a running softmax denominator l and an unnormalised output O:
#
# $$S^{(j)} = Q_i K^{(j)\top}/\sqrt{d}, \qquad m^{(j)} = \max\big(m^{(j-1)}, \operatorname{rowmax} S^{(j)}\big), \qquad \tilde P^{(j)} = \exp\big(S^{(j)} - m^{(j)}\big)$$
#
# $$l^{(j)} = e^{m^{(j-1)} - m^{(j)}}\, l^{(j-1)} + \operatorname{rowsum} \tilde P^{(j)}, \qquad O^{(j)} = \operatorname{diag}\big(e^{m^{(j-1)} - m^{(j)}}\big)\, O^{(j-1)} + \tilde P^{(j)} V^{(j)}$$
#
# and at the end $O_i = \operatorname{diag}(l^{(T_k)})^{-1} O^{(T_k)}$ and the logsumexp $L_i = m^{(T_k)} + \log l^{(T_k)}$.
# Whenever the running maximum grows, the factor $e^{m^{(j-1)} - m^{(j)}} \le 1$ rescales what was
# accumulated under the old maximum, so the result equals softmax(S) V exactly, without ever holding
# a full row of S. Only L, Q, K, V and O are saved: memory linear in the sequence length.
# With the causal flag, query i sees keys j ≤ i (the upper-left aligned mask of
# `scaled_dot_product_attention(is_causal=True)`) and −10⁶ is added to the scores of later keys;
# key tiles entirely after a query tile are skipped.
#
# The PyTorch version (the two loops of the algorithm; each tile op is batched over batch·heads):

# %%
show_source(flash_forward_tiles)

# %% [markdown]
# The Triton kernel: one program per (query tile, batch·head) — the launch grid is
# (⌈N_q/B_q⌉, batch·heads) — and a single loop over key tiles. Block pointers load Q_i once and
# K⁽ʲ⁾, V⁽ʲ⁾ per iteration (zeros outside the tensor, so any length works) and advance at the end of
# the loop. O, l and m live in fp32 registers; P̃ is cast to V's dtype before the tensor-core
# product. exp is computed as exp2 with log₂e folded into the 1/√d scale (exp2 is the hardware
# instruction). The head dimension is padded on chip to a power of two ≥ 16, so any d ≤ 256 runs.

# %%
show_source(flash_fwd_kernel)

# %% [markdown]
# ## The backward pass: equations 13–19
# With D = rowsum(O ∘ dO) (= rowsum(P ∘ dP), since P dPᵀ = P V dOᵀ = O dOᵀ), the softmax's
# backward needs no row reduction over P, and P is recomputed from L instead of being stored:
#
# $$S = QK^\top/\sqrt d,\quad P = \exp(S - L),\quad dV = P^\top dO,\quad dP = dO\,V^\top,\quad dS = P \circ (dP - D),\quad dQ = dS\,K/\sqrt d,\quad dK = dS^\top Q/\sqrt d.$$
#
# The PyTorch backward (compiled with `torch.compile` by default) writes these equations directly:

# %%
show_source(flash_backward_reference)

# %% [markdown]
# The Triton backward (Algorithm 2) recomputes each tile of P twice rather than synchronise: the
# first kernel runs one program per key tile and loops over query tiles, accumulating dK⁽ʲ⁾ and
# dV⁽ʲ⁾ in registers (it computes the transposed tiles Sᵀ = K⁽ʲ⁾Q_iᵀ directly); the second runs one
# program per query tile and loops over key tiles for dQ_i. Each output tile has a single owner,
# so no atomics are needed. The call's `backward_impl` (else `DEFAULTS.backward_impl`)
# picks "triton" (default) or "pytorch".

# %%
show_source(flash_bwd_dkdv_kernel)
show_source(flash_bwd_dq_kernel)

# %% [markdown]
# ## Correctness against a float64 reference
# Each case draws Q, K, V (and an upstream gradient dO) in the given dtype, runs forward and
# backward, and compares O, the saved L, dQ, dK and dV with softmax attention computed in float64
# by torch's own `softmax` and `logsumexp` from the same (rounded) inputs. The error is
# norm-wise, ‖x − ref‖ / ‖ref‖ (with the largest absolute error beside it); the tolerance is 10⁻³ in
# fp32 and 10⁻² in fp16/bf16. Shapes cover lengths that are not multiples of the tile (nor, for one, of
# 16) and fewer queries than keys; on a GPU they share one head dimension, so the Triton kernels
# compile once per dtype, causal flag and length alignment rather than per shape. The PyTorch
# backward runs uncompiled here (the same equations; compiling it for every dtype and causal flag
# would cost more than the whole table); the compiled one is checked by the tests
# (`test_pytorch_compiled_backward_matches_float64`) and, on a GPU, runs in the memory sweep below.
# Each case prints a progress line.

# %%
# (shape of q, shape of k and v, causal flags); the cpu profile keeps the interpreter's work small
shapes = ctx.pick(None, cpu=[((2, 37, 16), (2, 37, 16), [False]), ((1, 2, 20, 32), (1, 2, 45, 32), [True])],
                  gpu=[((2, 8, 1024, 64), (2, 8, 1024, 64), [False, True]),
                       ((16, 1040, 64), (16, 1040, 64), [False, True]),
                       ((2, 8, 528, 64), (2, 8, 2064, 64), [False, True]),
                       ((2, 8, 1000, 64), (2, 8, 1000, 64), [True])])
cases = [dict(shape_q=sq, shape_kv=skv, dtype=dt, is_causal=c)
         for sq, skv, flags in shapes for dt in [torch.float32, torch.float16, torch.bfloat16] for c in flags]
implementations = {
    "flash_pytorch": FlashAttentionPytorch.apply,
    "flash_triton": FlashAttentionTriton.apply,
    "flash_triton, PyTorch backward": lambda q, k, v, c: flash_attention_triton(q, k, v, c, backward_impl="pytorch"),
}
FlashAttentionPytorch.compile_backward = False
acc = accuracy_table(implementations, cases, device=ctx.device, progress=True)
FlashAttentionPytorch.compile_backward = compile_backward
wide = acc.pivot_table(index=["implementation", "shape_q", "shape_kv", "dtype", "is_causal"], columns="tensor",
                       values="relative_error", sort=False)[["O", "L", "dQ", "dK", "dV"]]
wide["max |error|"] = acc.groupby(["implementation", "shape_q", "shape_kv", "dtype", "is_causal"], sort=False).max_abs_error.max()
wide["passes"] = acc.groupby(["implementation", "shape_q", "shape_kv", "dtype", "is_causal"], sort=False).passes.all()
ctx.save_table(acc, "flash_accuracy_raw", show=False)
ctx.save_table(wide.reset_index(), "flash_accuracy", show=False)
wide.reset_index().style.format("{:.1e}", subset=["O", "L", "dQ", "dK", "dV", "max |error|"]).hide(axis="index")

# %%
worst = acc.groupby(["implementation", "dtype"]).relative_error.max().unstack()
n_pass = int(wide.passes.sum())
ctx.md(
    f"{n_pass} of {len(wide)} cases are within the tolerance on every tensor. Largest norm-wise error per implementation and dtype: "
    + "; ".join(f"**{impl}** " + ", ".join(f"{dt} {worst.loc[impl, dt]:.1e}" for dt in worst.columns)
                for impl in worst.index)
    + f" (tolerances: {', '.join(f'{str(k)[6:]} {v.checks:g}' for k, v in TOLERANCE.items())})."
)
ctx.headline("FlashAttention cases passing the float64 check", f"{n_pass}/{len(wide)}")

# %% [markdown]
# ### The answers to `flash_forward` (a), (b), (c) and `flash_backward`
# Where each part is implemented, and what the check above measured for it.

# %%
give(ctx, "flash_forward.a", "flash_forward.b", "flash_forward.c", "flash_backward")
half = acc[acc.dtype != "float32"]
ctx.md(
    f"In fp16/bf16 the largest error of L is {half[half.tensor == 'L'].relative_error.max():.1e}, against "
    f"{half[half.tensor == 'O'].relative_error.max():.1e} for O: the running statistics m, l and L and every accumulator "
    f"stay in fp32, and the half-precision error comes from rounding the output (and, in the Triton kernels, P̃ and dS "
    f"before their tensor-core products) to 8 (bf16) or 11 (fp16) significant bits."
)

# %% [markdown]
# ## Memory against sequence length: naive against FlashAttention
# Batch 1, causal, fp32. `saved for backward` is what autograd keeps between forward and backward
# (measured with saved-tensor hooks, any device); `peak` is the CUDA allocator's peak during
# forward + backward above the inputs (GPU only).

# %%
if ctx.device.type == "cuda":
    memory_impls = {
        "naive": naive_attention,
        "flash_triton": lambda q, k, v, c: flash_attention_triton(q, k, v, c, backward_impl="triton"),
        "flash_triton, PyTorch backward": lambda q, k, v, c: flash_attention_triton(q, k, v, c, backward_impl="pytorch"),
    }
else:
    memory_impls = {"naive": naive_attention, "flash_pytorch": FlashAttentionPytorch.apply}
    ctx.not_run("peak allocator memory and the Triton kernels at long sequences",
                "no CUDA device: the CPU keeps no allocator statistics and the Triton interpreter is too slow for long sequences; "
                "the saved-for-backward memory is measured instead")
mem = peak_memory_sweep(memory_impls, memory_seq_lens, batch=memory_batch, d_model=memory_d_model, device=ctx.device)
ctx.save_table(mem, "flash_memory");

# %%
value = "peak_mib" if ctx.device.type == "cuda" else "saved_for_backward_mib"
ok = mem[mem.status == "ok"]
fig, ax = plt.subplots(figsize=(7, 4.5))
sns.lineplot(data=ok, x="seq_len", y=value, hue="implementation", marker="o", ax=ax)
seq_len_axis(ax, mem.seq_len)
ax.set(yscale="log", ylabel=value.replace("_mib", " (MiB)").replace("_", " "),
       title=f"Attention memory, batch {memory_batch}, d = {memory_d_model}, causal")
ctx.save_figure(fig, "flash_memory")
longest = ok.seq_len.max()
at_longest = ok[ok.seq_len == longest].set_index("implementation")[value]
growth = {impl: g.sort_values("seq_len")[value].iloc[-1] / g.sort_values("seq_len")[value].iloc[-2]
          for impl, g in ok.groupby("implementation", sort=False) if len(g) > 1}
naive_oom = mem[(mem.implementation == "naive") & (mem.status == "OOM")].seq_len
ctx.md(
    f"At sequence length {longest:,} ({value.replace('_mib', '').replace('_', ' ')}): "
    + ", ".join(f"{impl} {v:,.2f} MiB" for impl, v in at_longest.items()) + ". "
    + (f"The naive attention runs out of memory from sequence length {naive_oom.min():,} on. " if len(naive_oom) else "")
    + "Doubling the sequence length between the two longest that ran multiplies the memory by "
    + ", ".join(f"{g:.2f} ({impl})" for impl, g in growth.items())
    + ": 4 is the signature of an N² term, 2 of memory linear in N."
)
