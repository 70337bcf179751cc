"""Triton kernels of the fused, multi-tensor AdamW (`cs336_systems.optim.fused_adamw.FusedAdamW`).

The math, per element, as torch.optim.AdamW (decoupled weight decay, bias-corrected moments), with
t the parameter's step count after this step, all of it in fp32 registers whatever the storage dtypes:

    p <- p (1 - lr wd)                              decoupled weight decay, first
    m <- b1 m + (1 - b1) g                          written m + (1 - b1)(g - m), torch's lerp
    v <- b2 v + (1 - b2) g^2
    p <- p - lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
         computed as p - step_size m / (sqrt(v) / sqrt(1 - b2^t) + eps), step_size = lr / (1 - b1^t),
         the order torch uses; sqrt and the division are IEEE round-to-nearest (tl.sqrt_rn, tl.div_rn).

The host computes the scalars in float64 (decay = 1 - lr wd, one_minus_b1, b2, one_minus_b2,
step_size, bc2_sqrt = sqrt(1 - b2^t), eps) and passes them as runtime arguments, never constexpr:
changing lr, betas, eps or wd between steps recompiles nothing.

Storing: an fp32 tensor takes the fp32 result. A bf16 tensor (the moments when the state dtype is
bf16, the parameter when it is bf16) takes it either rounded to nearest even or, with STOCHASTIC,
rounded stochastically (both on the bit pattern, so the interpreter, whose own cast truncates, stores
the bits the GPU stores): the fp32 bit pattern plus a uniform 16-bit random integer, truncated to its top 16
bits, rounds x up with probability (x - down) / (up - down), so E[round(x)] = x. The random bits are
counter-based (Philox, `tl.philox`), one call per pair of elements (2j, 2j + 1) of a tensor: key = the
launch's seed (the optimizer's seed in the high 32 bits, the step in the low 32), counter = (low, high 32
bits of element 2j's global index, 0, 0), where the global index is the element's position in the
concatenation of all the optimizer's parameters. Of its four 32-bit outputs the first three feed m, v
and p: their high 16 bits element 2j's, their low 16 bits element 2j + 1's. (Philox is the kernel's
costliest arithmetic; one call per element, a fresh 32-bit word per store, made the update slower without
making the 16 bits each store uses any more random.) A fixed seed gives the same bits on every run and
every block size, on CPU (interpreter) and GPU alike. inf is stored as it is, NaN as the quiet NaN.

Launching (`adamw_multi_tensor_kernel`): ONE launch walks a whole list of tensors. The host passes
an int64 table of data addresses (4 rows of T: params, grads, exp_avg, exp_avg_sq), the tensors'
sizes and global element offsets (int64, T each), and a block table (int32, 2 rows of n_blocks: the
tensor index and the block index inside that tensor of each program). Program `pid` reads its
(tensor, block), turns the four addresses into typed pointers with `.to(tl.pointer_type(dtype))`,
and updates BLOCK elements of that tensor. The tables live on the tensors' device, built by the
optimizer and cached while the parameters (and their gradients' storage) stay the same.

Under the Triton interpreter (TRITON_INTERPRET=1, CPU tensors) the same kernel runs unchanged: the
interpreter keeps CPU tensors where they are, so the raw addresses in the table are valid host
addresses and `int -> pointer` is a bitcast there. The CPU path differs from the CUDA path only in
BLOCK (`block_size`: larger under the interpreter, where every program is a Python call) and in
speed; `adamw_single_tensor_kernel` (one tensor per launch, the same `adamw_block` inner function)
is kept as a reference and for debugging, not used by the optimizer.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from cs336_systems.triton_support.interpreter import built_by_interpreter

# fp32's largest finite value: |x| <= this is False for inf and NaN.
_FP32_MAX = tl.constexpr(3.4028234663852886e38)


def kernels_interpreted() -> bool:
    """True when the kernels were built by the Triton interpreter (TRITON_INTERPRET=1 at import)."""
    return built_by_interpreter(adamw_multi_tensor_kernel)


def block_size(device: torch.device, largest_numel: int) -> int:
    """Elements per program: 512 on a GPU (4 warps, 4 per thread: more programs in flight hide the table
    lookups' latency better than longer ones, docs/fused_adamw_record.md). Under the interpreter (CPU), where
    each program costs a Python call and NumPy vectorises the block, the largest tensor's size rounded
    up to a power of two, at most 16384 (the random bits of a whole block cost the same at any size)."""
    if device.type != "cpu":
        return 512
    return min(16384, max(16, triton.next_power_of_2(largest_numel)))


def triton_dtype(dtype: torch.dtype):
    """The Triton element type of a parameter or state dtype (fp32 or bf16)."""
    if dtype == torch.float32:
        return tl.float32
    if dtype == torch.bfloat16:
        return tl.bfloat16
    raise TypeError(f"fused AdamW kernels take float32 or bfloat16 tensors, not {dtype}")


@triton.jit
def round_to_bf16(x, rbits, STOCHASTIC: tl.constexpr):
    """fp32 -> bf16: to nearest even, or stochastically with the top 16 of the uint32 random bits
    `rbits`. Both round on the bit pattern and leave the low 16 bits zero, so the final cast is exact:
    the interpreter's own fp32 -> bf16 cast truncates, and this way CPU and GPU store the same bits."""
    bits = x.to(tl.uint32, bitcast=True)
    if STOCHASTIC:
        rounded = ((bits + (rbits >> 16)) >> 16) << 16
    else:
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    rounded = tl.where(tl.abs(x) <= _FP32_MAX, rounded, bits)  # inf unchanged
    rounded = tl.where(x == x, rounded, 0x7FC00000)  # NaN: the canonical quiet NaN
    return rounded.to(tl.float32, bitcast=True).to(tl.bfloat16)


@triton.jit
def store_rounded(ptr, offs, mask, x, rbits, STORE_BF16: tl.constexpr, STOCHASTIC: tl.constexpr):
    if STORE_BF16:
        tl.store(ptr + offs, round_to_bf16(x, rbits, STOCHASTIC), mask=mask)
    else:
        tl.store(ptr + offs, x, mask=mask)


@triton.jit
def adamw_block(
    p_ptr,
    g_ptr,
    m_ptr,
    v_ptr,
    offs,
    mask,
    first_index,
    decay,
    one_minus_b1,
    b2,
    one_minus_b2,
    eps,
    step_size,
    bc2_sqrt,
    seed,
    P_BF16: tl.constexpr,
    S_BF16: tl.constexpr,
    STOCHASTIC: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """One block of the AdamW update (the math of the module docstring) at offsets `offs`, BLOCK of them from
    an even offset of the tensor; `first_index` is the global index of the block's first element."""
    p = tl.load(p_ptr + offs, mask=mask).to(tl.float32)
    g = tl.load(g_ptr + offs, mask=mask).to(tl.float32)
    m = tl.load(m_ptr + offs, mask=mask).to(tl.float32)
    v = tl.load(v_ptr + offs, mask=mask).to(tl.float32)
    p = p * decay
    m = m + one_minus_b1 * (g - m)
    v = v * b2 + one_minus_b2 * g * g
    denom = tl.div_rn(tl.sqrt_rn(v), bc2_sqrt) + eps
    p = p - step_size * tl.div_rn(m, denom)
    if (P_BF16 or S_BF16) and STOCHASTIC:
        pairs = first_index + 2 * tl.arange(0, BLOCK // 2).to(tl.int64)  # global index of each pair's first
        zero = tl.zeros_like(pairs).to(tl.uint32)
        r0, r1, r2, _ = tl.philox(seed, (pairs & 0xFFFFFFFF).to(tl.uint32), (pairs >> 32).to(tl.uint32), zero, zero)
        # element 2j takes the high halves, 2j + 1 the low ones (round_to_bf16 reads the top 16 bits)
        r_m = tl.reshape(tl.join(r0, r0 << 16), [BLOCK])
        r_v = tl.reshape(tl.join(r1, r1 << 16), [BLOCK])
        r_p = tl.reshape(tl.join(r2, r2 << 16), [BLOCK])
    else:
        r_m = offs
        r_v = offs
        r_p = offs
    store_rounded(m_ptr, offs, mask, m, r_m, S_BF16, STOCHASTIC)
    store_rounded(v_ptr, offs, mask, v, r_v, S_BF16, STOCHASTIC)
    store_rounded(p_ptr, offs, mask, p, r_p, P_BF16, STOCHASTIC)


@triton.jit(do_not_specialize=["n_tensors", "n_blocks", "seed"])
def adamw_multi_tensor_kernel(
    addresses_ptr,  # int64 [4, T]: data addresses of params, grads, exp_avg, exp_avg_sq
    numels_ptr,  # int64 [T]
    global_offsets_ptr,  # int64 [T]: index of each tensor's first element among all parameters
    block_table_ptr,  # int32 [2, n_blocks]: tensor index, block index inside the tensor
    n_tensors,
    n_blocks,
    decay,
    one_minus_b1,
    b2,
    one_minus_b2,
    eps,
    step_size,
    bc2_sqrt,
    seed,
    P_DTYPE: tl.constexpr,
    S_DTYPE: tl.constexpr,
    STOCHASTIC: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    t = tl.load(block_table_ptr + pid)
    block = tl.load(block_table_ptr + n_blocks + pid).to(tl.int64)
    p_ptr = tl.load(addresses_ptr + t).to(tl.pointer_type(P_DTYPE))
    g_ptr = tl.load(addresses_ptr + n_tensors + t).to(tl.pointer_type(P_DTYPE))
    m_ptr = tl.load(addresses_ptr + 2 * n_tensors + t).to(tl.pointer_type(S_DTYPE))
    v_ptr = tl.load(addresses_ptr + 3 * n_tensors + t).to(tl.pointer_type(S_DTYPE))
    numel = tl.load(numels_ptr + t)
    offs = block * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    mask = offs < numel
    adamw_block(
        p_ptr,
        g_ptr,
        m_ptr,
        v_ptr,
        offs,
        mask,
        tl.load(global_offsets_ptr + t) + block * BLOCK,
        decay,
        one_minus_b1,
        b2,
        one_minus_b2,
        eps,
        step_size,
        bc2_sqrt,
        seed,
        tl.bfloat16 == P_DTYPE,
        tl.bfloat16 == S_DTYPE,
        STOCHASTIC,
        BLOCK,
    )


@triton.jit(do_not_specialize=["numel", "global_offset", "seed"])
def adamw_single_tensor_kernel(
    p_ptr,
    g_ptr,
    m_ptr,
    v_ptr,
    numel,
    global_offset,
    decay,
    one_minus_b1,
    b2,
    one_minus_b2,
    eps,
    step_size,
    bc2_sqrt,
    seed,
    STOCHASTIC: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """The same update, one tensor per launch (a reference: the optimizer launches the multi-tensor kernel)."""
    start = tl.program_id(0).to(tl.int64) * BLOCK
    offs = start + tl.arange(0, BLOCK).to(tl.int64)
    mask = offs < numel
    adamw_block(
        p_ptr,
        g_ptr,
        m_ptr,
        v_ptr,
        offs,
        mask,
        global_offset + start,
        decay,
        one_minus_b1,
        b2,
        one_minus_b2,
        eps,
        step_size,
        bc2_sqrt,
        seed,
        p_ptr.dtype.element_ty == tl.bfloat16,
        m_ptr.dtype.element_ty == tl.bfloat16,
        STOCHASTIC,
        BLOCK,
    )
