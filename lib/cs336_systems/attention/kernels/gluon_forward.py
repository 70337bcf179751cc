"""FlashAttention-2 forward kernel for Hopper in Gluon: a TMA producer warp and two consumer
warpgroups, each overlapping its softmax with a matmul (FlashAttention-3's schedule).

The math is the Triton forward kernel's (`kernels.triton_forward`): per query tile Q_i, over key
tiles K^(j), V^(j), in base 2 with s = S log2(e) scale,

    m_j = max(m_{j-1}, rowmax s_j);  P_j = 2^(s_j - m_j);  alpha_j = 2^(m_{j-1} - m_j)
    l_j = alpha_j l_{j-1} + rowsum P_j;  O_j = diag(alpha_j) O_{j-1} + P_j V^(j)
    O = O_last / l;  L = (m + log2 l) ln 2

What Triton's `tl` cannot express on Hopper is the schedule:

- *Overlap inside a warpgroup.* `tl.dot` waits for a product that is not an accumulator as soon as
  it is issued, so a warpgroup runs S_j = Q K_j^T, the softmax, then P_j V_j, one after another.
  Here step j issues two asynchronous warpgroup matmuls, S_j and O += P_{j-1} V_{j-1}, waits for
  S_j only, and computes the softmax of tile j while the tensor cores run P_{j-1} V_{j-1}:

      issue S_j;  issue O_{j-1} = diag(alpha_{j-1}) O_{j-2} + P_{j-1} V_{j-1};  wait S_j
      softmax(S_j) -> P_j, alpha_j, l_j, m_j;  wait O_{j-1}

- *Warp specialization.* One CTA holds 2 Q_TILE query rows. A producer warp copies Q and the K, V
  tiles by TMA into a ring of STAGES shared-memory slots (an mbarrier per slot counts the bytes
  in); two consumer warpgroups, one per Q_TILE rows, read the same K, V slots and release each
  (a second mbarrier, count 2) once both have waited for the matmul that read it. The consumers
  never issue loads or wait at a CTA-wide barrier, and each runs its own schedule, so one
  warpgroup's exponentials meet the other's matmuls.

Causal CTAs visit key tiles up to the diagonal and mask the tiles that cross it (or pass N);
the last query blocks (longest loops) start first, heads in sections (`kernels.gluon_schedule`). L is
stored per row; O goes through Q's shared-memory slot and a TMA store, which drops rows past N.

Scope (`heuristics.gluon_forward_eligible`, `launch.dispatch.rule_choices`): 16-bit inputs on compute
capability 9.x, N_QUERIES == N_KEYS, d in {64, 128}, rows readable by tensor descriptors. Other inputs take
the Triton kernel.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from cs336_systems.attention.kernels.gluon_schedule import block_and_batch
from cs336_systems.attention.kernels.triton_forward import LN2, LOG2E  # gl.constexpr is tl.constexpr


@gluon.jit
def _softmax_step(
    s,
    m_i,
    l_i,
    qk_scale,
    k_start,
    query_pos,
    N_KEYS,
    MASKED: gl.constexpr,
    is_causal: gl.constexpr,
    s_layout: gl.constexpr,
):
    """P_j, alpha_j and the new (m, l) from the raw scores S_j (fp32, mma layout)."""
    if MASKED:
        key_pos = k_start + gl.arange(0, s.shape[1], layout=gl.SliceLayout(0, s_layout))
        keep = key_pos[None, :] < N_KEYS
        if is_causal:
            keep = keep & (key_pos[None, :] <= query_pos[:, None])
        s = gl.where(keep, s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
    p = gl.exp2(s * qk_scale - m_new[:, None])
    alpha = gl.exp2(m_i - m_new)
    l_i = l_i * alpha + gl.sum(p, axis=1)
    return p, alpha, l_i, m_new


@gluon.jit
def _producer(q_desc, k_desc, v_desc, buffers, barriers, batch, q_start, n_tiles):
    """Both Q tiles, then K and V tile t into slot t % STAGES once both consumers have released it."""
    q_smem, k_smem, v_smem = buffers
    q_ready, k_ready, v_ready, k_empty, v_empty = barriers
    STAGES: gl.constexpr = k_smem.shape[0]
    Q_TILE: gl.constexpr = q_desc.block_type.shape[1]
    K_TILE: gl.constexpr = k_desc.block_type.shape[1]
    for h in gl.static_range(2):
        mbarrier.expect(q_ready.index(h), q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [batch, q_start + h * Q_TILE, 0], q_ready.index(h), q_smem.index(h))
    for t in range(n_tiles):
        slot = t % STAGES
        phase = (t // STAGES) & 1
        mbarrier.wait(k_empty.index(slot), phase ^ 1)
        mbarrier.expect(k_ready.index(slot), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [batch, t * K_TILE, 0], k_ready.index(slot), k_smem.index(slot))
        mbarrier.wait(v_empty.index(slot), phase ^ 1)
        mbarrier.expect(v_ready.index(slot), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(v_desc, [batch, t * K_TILE, 0], v_ready.index(slot), v_smem.index(slot))


@gluon.jit
def _consumer(h: gl.constexpr, is_causal: gl.constexpr, o_desc, buffers, barriers, work):
    """Query rows [q_start + h Q_TILE, + Q_TILE): the overlapped loop over key tiles, then O and L."""
    L_ptr, stride_lb, stride_lq, batch, q_start, n_tiles, N_QUERIES, N_KEYS, qk_scale = work
    q_smem, k_smem, v_smem = buffers
    q_ready, k_ready, v_ready, k_empty, v_empty = barriers
    NUM_WARPS: gl.constexpr = 4
    STAGES: gl.constexpr = k_smem.shape[0]
    Q_TILE: gl.constexpr = q_smem.shape[2]
    K_TILE: gl.constexpr = k_smem.shape[2]
    D: gl.constexpr = q_smem.shape[3]
    dtype: gl.constexpr = q_smem.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[NUM_WARPS, 1], instr_shape=[16, K_TILE, 16]
    )
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[NUM_WARPS, 1], instr_shape=[16, D, 16]
    )
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)

    my_start = q_start + h * Q_TILE
    n_full = N_KEYS // K_TILE
    if is_causal:
        n_full = gl.minimum(n_full, (my_start + 1) // K_TILE)
    query_pos = my_start + gl.arange(0, Q_TILE, layout=row_s)
    q_tile = q_smem.index(h).reshape([Q_TILE, D])
    s_zero = gl.zeros([Q_TILE, K_TILE], gl.float32, layout=s_layout)

    mbarrier.wait(q_ready.index(h), 0)
    mbarrier.wait(k_ready.index(0), 0)
    s = warpgroup_mma(q_tile, k_smem.index(0).reshape([K_TILE, D]).permute((1, 0)), s_zero, use_acc=False)
    mbarrier.arrive(k_empty.index(0))
    m_i = gl.full([Q_TILE], float("-inf"), gl.float32, layout=row_s)
    l_i = gl.zeros([Q_TILE], gl.float32, layout=row_s)
    if n_full > 0:
        p, alpha, l_i, m_i = _softmax_step(s, m_i, l_i, qk_scale, 0, query_pos, N_KEYS, False, is_causal, s_layout)
    else:
        p, alpha, l_i, m_i = _softmax_step(s, m_i, l_i, qk_scale, 0, query_pos, N_KEYS, True, is_causal, s_layout)
    o = gl.zeros([Q_TILE, D], gl.float32, layout=o_layout)
    for j in range(1, n_tiles):
        slot = j % STAGES
        prev = (j - 1) % STAGES
        mbarrier.wait(k_ready.index(slot), (j // STAGES) & 1)
        s_token = warpgroup_mma(
            q_tile, k_smem.index(slot).reshape([K_TILE, D]).permute((1, 0)), s_zero, use_acc=False, is_async=True
        )
        mbarrier.wait(v_ready.index(prev), ((j - 1) // STAGES) & 1)
        p_op = gl.convert_layout(p.to(dtype), p_layout)
        o_token = warpgroup_mma(p_op, v_smem.index(prev).reshape([K_TILE, D]), o, is_async=True)
        s = warpgroup_mma_wait(1, deps=[s_token])
        mbarrier.arrive(k_empty.index(slot))
        if j < n_full:
            p, alpha, l_i, m_i = _softmax_step(
                s, m_i, l_i, qk_scale, j * K_TILE, query_pos, N_KEYS, False, is_causal, s_layout
            )
        else:
            p, alpha, l_i, m_i = _softmax_step(
                s, m_i, l_i, qk_scale, j * K_TILE, query_pos, N_KEYS, True, is_causal, s_layout
            )
        o, p_op = warpgroup_mma_wait(0, deps=[o_token, p_op])
        mbarrier.arrive(v_empty.index(prev))
        o = o * gl.convert_layout(alpha, row_o)[:, None]
    last = (n_tiles - 1) % STAGES
    mbarrier.wait(v_ready.index(last), ((n_tiles - 1) // STAGES) & 1)
    p_op = gl.convert_layout(p.to(dtype), p_layout)
    o = warpgroup_mma(p_op, v_smem.index(last).reshape([K_TILE, D]), o)
    mbarrier.arrive(v_empty.index(last))

    o = o / gl.convert_layout(l_i, row_o)[:, None]
    lse = (m_i + gl.log2(l_i)) * LN2
    gl.store(L_ptr + batch.to(gl.int64) * stride_lb + query_pos * stride_lq, lse, mask=query_pos < N_QUERIES)
    q_tile.store(o.to(dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [batch, my_start, 0], q_smem.index(h))
    tma.store_wait(0)


# Constexprs do not pass through warp_specialize's argument tuples: the half and the causality are
# fixed per function.
@gluon.jit
def _consumer0_causal(o_desc, buffers, barriers, work):
    _consumer(0, True, o_desc, buffers, barriers, work)


@gluon.jit
def _consumer0_full(o_desc, buffers, barriers, work):
    _consumer(0, False, o_desc, buffers, barriers, work)


@gluon.jit
def _consumer1_causal(o_desc, buffers, barriers, work):
    _consumer(1, True, o_desc, buffers, barriers, work)


@gluon.jit
def _consumer1_full(o_desc, buffers, barriers, work):
    _consumer(1, False, o_desc, buffers, barriers, work)


@gluon.jit
def flash_fwd_gluon_kernel(
    q_desc,
    k_desc,
    v_desc,
    o_desc,
    L_ptr,
    stride_lb,
    stride_lq,
    N_QUERIES,
    N_KEYS,
    scale: gl.constexpr,
    STAGES: gl.constexpr,
    is_causal: gl.constexpr,
    SECTION: gl.constexpr,  # heads per section of the CTAs' order (kernels.gluon_schedule)
    CONSUMER_REGS: gl.constexpr,  # registers per thread of a consumer warpgroup, and of the producer warp
    PRODUCER_REGS: gl.constexpr,
):
    dtype: gl.constexpr = q_desc.dtype
    Q_TILE: gl.constexpr = q_desc.block_type.shape[1]
    K_TILE: gl.constexpr = k_desc.block_type.shape[1]
    D: gl.constexpr = q_desc.block_type.shape[2]
    rank, batch, n_blocks = block_and_batch(N_QUERIES, 2 * Q_TILE, SECTION)
    tile_index = rank
    if is_causal:
        tile_index = n_blocks - 1 - rank  # the last query block visits the most key tiles
    q_start = tile_index * (2 * Q_TILE)

    q_smem = gl.allocate_shared_memory(dtype, [2, 1, Q_TILE, D], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, K_TILE, D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, K_TILE, D], v_desc.layout)
    q_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(q_ready.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=2)
        mbarrier.init(v_empty.index(i), count=2)
    fence_async_shared()

    n_tiles = gl.cdiv(N_KEYS, K_TILE)
    if is_causal:
        n_tiles = gl.minimum(n_tiles, gl.cdiv(q_start + 2 * Q_TILE, K_TILE))
    qk_scale = scale * LOG2E
    buffers = (q_smem, k_smem, v_smem)
    barriers = (q_ready, k_ready, v_ready, k_empty, v_empty)
    work = (L_ptr, stride_lb, stride_lq, batch, q_start, n_tiles, N_QUERIES, N_KEYS, qk_scale)
    consumer_args = (o_desc, buffers, barriers, work)
    producer_args = (q_desc, k_desc, v_desc, buffers, barriers, batch, q_start, n_tiles)
    if is_causal:
        gl.warp_specialize(
            [(_consumer0_causal, consumer_args), (_consumer1_causal, consumer_args), (_producer, producer_args)],
            [4, 1],
            [CONSUMER_REGS, PRODUCER_REGS],
        )
    else:
        gl.warp_specialize(
            [(_consumer0_full, consumer_args), (_consumer1_full, consumer_args), (_producer, producer_args)],
            [4, 1],
            [CONSUMER_REGS, PRODUCER_REGS],
        )
