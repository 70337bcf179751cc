"""FlashAttention-2 backward for Hopper in Gluon at head dimension 128: dQ, dK and dV in one pass, each
consumer warpgroup computing half of dQ's columns over all of the CTA's keys.

The math and the pipeline are `kernels.gluon_backward`'s (d = 64): a CTA owns 2 K_HALF key rows, a
producer warp brings K, V once and Q_i, dO_i per query tile into a ring of slots, and consumer warpgroup
h, owning key rows K^(j,h), V^(j,h), computes per tile, transposed so that P^T and dS^T have its key rows
(base 2, s = log2(e) scale)

    S^T = K^(j,h) Q_i^T;   P^T = 2^(s S^T - log2(e) L_i);   dP^T = V^(j,h) dO_i^T
    dS^T = P^T * (scale dP^T - scale D_i);   dV^(j,h) += P^T dO_i;   dK^(j,h) += dS^T Q_i

P^T and dS^T are register operands of dV's and dK's products: the accumulator's layout is the operand's,
so neither goes through shared memory for them (FlashAttention-3 stores P for dV at d = 128; so did an
earlier version of this kernel, docs/flash_attention_tuning.md). dS carries the softmax scale: with scale
D_i formed once per tile, scaling costs one multiply-add per element in place of a subtraction, and
neither dK nor dQ's parts need a multiply afterwards.

What d = 128 changes is the register budget. dK and dV of 64 key rows are 128 fp32 registers per thread,
S^T and dP^T of a 64 x 64 tile 64 more, so K and V cannot stay in registers as operands (they are read
from shared memory), and a whole (Q_TILE, 128) fp32 dQ part, 64 registers, does not fit beside them.
In the transposed layout L_i and D_i vary along the accumulator's columns, 16 registers each per thread,
and loaded a tile ahead they spilled. So the producer warp stores each tile's rows of L and D into
its slot beside Q_i and dO_i, and a consumer reads them from shared memory where it uses them.
dQ's part of tile i is split by columns instead of by keys: warpgroup h computes

    dQ_i[:, c_h] += dS_{i,0} K^(j,0)[:, c_h] + dS_{i,1} K^(j,1)[:, c_h],   c_h = [64 h, 64 h + 64)

from both warpgroups' dS^T in shared memory (read transposed): 32 registers, and every warpgroup does
the same work on every tile, so there is no owner to alternate (d = 64's kernel alternates one). Each
part goes out by a TMA reduce-add, one per (tile, CTA, column half), into an fp32 accumulator that holds
the two column halves as planes, (batch, 2, N, 64), converted to dQ's (batch, N, 128) afterwards: a
reduce-add at a column offset inside 128-wide fp32 rows landed at column 0 (Triton 3.6 splits the
512-byte rows into 128-byte boxes and the offset was lost; found with a counting variant).

Tile i's dQ products are issued during tile i + 1, before that tile's dK product: the warpgroup then
waits for dV's product and the dQ part only, and writes the part to shared memory and issues its reduce-add
while dK's product runs on the tensor cores (issued after it, that work left them idle on this warpgroup's
turn). Neither warpgroup waits for the other's dS of the tile it is working on. Per consumer warpgroup and tile:

    issue S^T, dP^T;  wait S^T;  P^T;  issue dV += P^T dO_i;  wait dP^T;  dS^T
    wait ds_free (tile i - 2's dQ products, both warpgroups', have read this buffer);  store dS^T;  arrive ds_ready
    wait ds_ready of tile i - 1;  issue its dQ part (2 products);  issue dK += dS^T Q_i
    wait dV and the dQ part;  arrive ds_free of tile i - 1;  reduce-add the dQ part (the previous one done first)
    wait dK;  release the slot

On the first visit there is no previous tile: its dQ products still run, on whatever the buffers hold, and
the result is dropped (with the products in a branch instead, ptxas spilled 684 bytes against 552). dK's
product is waited for within its visit: carried in flight into the next visit, to be waited for with its S,
it made ptxas serialize every wgmma of the kernel (advisory C7515: registers of a running wgmma's
accumulator defined by other instructions).

Both barriers count 2 (one arrival per warpgroup); with two dS^T buffers per warpgroup, the k-th
completion of a parity-b barrier stands for tile b + 2k (`ds_ready_phase`, `ds_free_phase`; replayed
on the CPU by tests/test_flash_gluon_handshake.py).

Causal: a CTA starts at the query tile of its first key, and both warpgroups visit every tile from
there; tiles crossing a warpgroup's diagonal are masked, so the second warpgroup's first tile, which
none of its keys sees, adds zeros (one masked tile per CTA, for a loop with no special first tile).
Non-causal: every CTA visits every query tile, unmasked. Rows past N: Q, dO, K, V are zero-filled by
TMA and L, D are stored as 0, so those rows add nothing to dV, dK or dQ (zero K rows add zero to dQ);
rows past N of dK, dV and dQ are dropped by the stores. dK and dV go out through the K and V slots, once
both warpgroups' last dQ products have read both halves of K.
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

from cs336_systems.attention.kernels.gluon_backward import (
    allocate_barriers,
    allocate_tiles,
    load_key_block,
    reduce_dq,
    store_dk_dv,
)
from cs336_systems.attention.kernels.gluon_schedule import block_and_batch
from cs336_systems.attention.kernels.triton_forward import LOG2E  # gl.constexpr is tl.constexpr


@gluon.jit
def ds_ready_phase(i):
    """The parity a wait for the i-th visited tile's completion of `ds_ready[i % 2]` (or `ds_free`) waits on."""
    return (i // 2) & 1


@gluon.jit
def ds_free_phase(i):
    """The parity a warpgroup waits on before storing the i-th visited tile's dS: tile i - 2's completion
    of `ds_free[i % 2]`; for i < 2 the parity of the phase before the first, which passes at once."""
    return ((i // 2) & 1) ^ 1


@gluon.jit
def _step(
    k_tile,
    v_tile,
    q_tile,
    do_tile,
    ds_buf,
    dv,
    dk,
    lse2,
    delta_smem,
    key_pos,
    query_pos,
    qk_scale,
    scale,
    s_zero,
    free_bar,
    free_phase,
    ready_bar,
    MASKED: gl.constexpr,
):
    """One query tile up to its dS^T (scaled: module docstring): S^T, P^T, dV's product issued (P^T a register
    operand), dP^T, dS^T stored once `free_bar` says both warpgroups' products of two tiles ago have read the
    buffer, then announced on `ready_bar`; returns dV's token and dS^T as dK's register operand. S^T and dP^T
    are (keys, queries), so L and D are per column: `lse2` in registers, D read from its slot here."""
    s_token = warpgroup_mma(k_tile, q_tile.permute((1, 0)), s_zero, use_acc=False, is_async=True)
    dp_token = warpgroup_mma(v_tile, do_tile.permute((1, 0)), s_zero, use_acc=False, is_async=True)
    s_t = warpgroup_mma_wait(1, deps=[s_token])
    p_t = gl.exp2(s_t * qk_scale - lse2[None, :])
    if MASKED:
        p_t = gl.where(key_pos[:, None] <= query_pos[None, :], p_t, 0.0)
    p_op = gl.convert_layout(
        p_t.to(q_tile.dtype), gl.DotOperandLayout(operand_index=0, parent=dv.type.layout, k_width=2)
    )
    dv_token = warpgroup_mma(p_op, do_tile, dv, is_async=True)
    dp_t = warpgroup_mma_wait(1, deps=[dp_token])
    scaled_delta = delta_smem.load(gl.SliceLayout(0, s_zero.type.layout)) * scale
    ds_t = (p_t * (dp_t * scale - scaled_delta[None, :])).to(q_tile.dtype)
    mbarrier.wait(free_bar, free_phase)
    ds_buf.store(ds_t)
    fence_async_shared()
    mbarrier.arrive(ready_bar)
    ds_op = gl.convert_layout(ds_t, gl.DotOperandLayout(operand_index=0, parent=dk.type.layout, k_width=2))
    return dv_token, ds_op


@gluon.jit
def _load_key_block_then_query_tiles(
    q_desc,
    k_desc,
    v_desc,
    do_desc,
    buffers,
    barriers,
    batch,
    k_start,
    q_first,
    q_step,
    n_tiles,
    L_row,
    Delta_row,
    stride_lq,
    N_QUERIES,
):
    """Both halves of K and V, then for the t-th query tile visited (rows from q_first + t q_step) its rows
    of L and D, stored by this warp, and Q_i, dO_i by TMA, into slot t % STAGES once both consumers have
    released it. L and D are 0 past N (module docstring)."""
    q_smem, do_smem, k_smem, v_smem, stats_smem = buffers[0], buffers[1], buffers[2], buffers[3], buffers[4]
    kv_ready, ready, empty = barriers[0], barriers[1], barriers[2]
    STAGES: gl.constexpr = q_smem.shape[0]
    Q_TILE: gl.constexpr = q_desc.block_type.shape[1]
    rows = gl.arange(0, Q_TILE, layout=gl.BlockedLayout([Q_TILE // 32], [32], [1], [0]))  # one warp
    load_key_block(k_desc, v_desc, k_smem, v_smem, kv_ready, batch, k_start)
    for t in range(n_tiles):
        slot = t % STAGES
        q_start = q_first + t * q_step
        pos = q_start + rows
        inside = (pos >= 0) & (pos < N_QUERIES)
        lse = gl.load(L_row + pos * stride_lq, mask=inside, other=0.0)
        delta = gl.load(Delta_row + pos * stride_lq, mask=inside, other=0.0)
        mbarrier.wait(empty.index(slot), ((t // STAGES) & 1) ^ 1)
        stats_smem.index(2 * slot).store(lse)
        stats_smem.index(2 * slot + 1).store(delta)
        # expect is an arrive on `ready`: a consumer whose wait on it completes sees these stores
        mbarrier.expect(ready.index(slot), q_desc.block_type.nbytes + do_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [batch, q_start, 0], ready.index(slot), q_smem.index(slot))
        tma.async_copy_global_to_shared(do_desc, [batch, q_start, 0], ready.index(slot), do_smem.index(slot))


@gluon.jit
def _dq_columns(ds_smem, k_smem, ds_ready, i, dq_zero, H: gl.constexpr):
    """Issues warpgroup H's column half of the i-th visited tile's dQ part, dS_0 K^(j,0)[:, c_H] +
    dS_1 K^(j,1)[:, c_H], once both warpgroups' dS of that tile are stored; returns its token. For i = -1
    it issues the products on whatever the buffers hold, without waiting (the caller drops the result)."""
    K_HALF: gl.constexpr = k_smem.shape[2]
    D: gl.constexpr = k_smem.shape[3]
    COLS: gl.constexpr = dq_zero.shape[1]
    b = (i + 2) % 2
    mbarrier.wait(ds_ready.index(b), ds_ready_phase(i), pred=i >= 0)
    k0 = k_smem.index(0).reshape([K_HALF, D]).slice(H * COLS, COLS, dim=1)
    k1 = k_smem.index(1).reshape([K_HALF, D]).slice(H * COLS, COLS, dim=1)
    dq = warpgroup_mma(ds_smem.index(b).permute((1, 0)), k0, dq_zero, use_acc=False, is_async=True)
    return warpgroup_mma(ds_smem.index(2 + b).permute((1, 0)), k1, dq, is_async=True)


@gluon.jit
def _query_tiles(dk, dv, loop, i_lo, i_hi, H: gl.constexpr, MASKED: gl.constexpr):
    """dK, dV over the visits i in [i_lo, i_hi) (query tile n_tiles - 1 - i), and the column half c_H of
    each previous visit's dQ part."""
    (
        k_tile,
        v_tile,
        k_smem,
        q_smem,
        do_smem,
        stats_smem,
        ds_smem,
        dq_buf,
        dq_desc,
        ready,
        empty,
        ds_ready,
        ds_free,
        key_pos,
        q_last,
        qk_scale,
        scale,
        s_zero,
        dq_zero,
        plane,
    ) = loop
    STAGES: gl.constexpr = q_smem.shape[0]
    Q_TILE: gl.constexpr = q_smem.shape[2]
    D: gl.constexpr = q_smem.shape[3]
    queries = gl.arange(0, Q_TILE, layout=gl.SliceLayout(0, s_zero.type.layout))  # the accumulator's columns
    for i in range(i_lo, i_hi):
        slot = i % STAGES
        q_start = q_last - i * Q_TILE
        q_tile = q_smem.index(slot).reshape([Q_TILE, D])
        do_tile = do_smem.index(slot).reshape([Q_TILE, D])
        mbarrier.wait(ready.index(slot), (i // STAGES) & 1)
        # L and D per column of the accumulator (16 registers each), read from the slot where used
        lse2 = stats_smem.index(2 * slot).load(queries.type.layout) * LOG2E
        ds_buf = ds_smem.index(2 * H + i % 2)
        dv_token, ds_op = _step(
            k_tile,
            v_tile,
            q_tile,
            do_tile,
            ds_buf,
            dv,
            dk,
            lse2,
            stats_smem.index(2 * slot + 1),
            key_pos,
            q_start + queries,
            qk_scale,
            scale,
            s_zero,
            ds_free.index(i % 2),
            ds_free_phase(i),
            ds_ready.index(i % 2),
            MASKED,
        )
        # the previous visit's dQ products before this one's dK product, so that dQ's reduce-add runs beside
        # dK's product; at i = 0 they run on whatever the buffers hold and are dropped (module docstring)
        dq = _dq_columns(ds_smem, k_smem, ds_ready, i - 1, dq_zero, H)
        dk_token = warpgroup_mma(ds_op, q_tile, dk, is_async=True)
        dv, dq = warpgroup_mma_wait(1, deps=[dv_token, dq])
        if i > 0:
            mbarrier.arrive(ds_free.index((i - 1) % 2))
            reduce_dq(dq, dq_buf, dq_desc, plane, q_start + Q_TILE, 1.0)  # dS carries the scale
        dk = warpgroup_mma_wait(0, deps=[dk_token])
        mbarrier.arrive(empty.index(slot))
    return dk, dv


@gluon.jit
def _consumer(h: gl.constexpr, out_descs, buffers, barriers, work):
    """Key rows [k_start + h K_HALF, + K_HALF): the loop over query tiles, last to first, the last visit's
    dQ part, then dK and dV."""
    batch, k_start, q_lo, n_tiles, n_full, qk_scale, scale = work
    dk_desc, dv_desc, dq_desc = out_descs
    q_smem, do_smem, k_smem, v_smem, stats_smem, ds_smem, dq_smem = buffers
    kv_ready, ready, empty, ds_ready, ds_free = barriers
    NUM_WARPS: gl.constexpr = 4
    Q_TILE: gl.constexpr = q_smem.shape[2]
    K_HALF: gl.constexpr = k_smem.shape[2]
    D: gl.constexpr = q_smem.shape[3]
    COLS: gl.constexpr = dq_smem.shape[3]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[NUM_WARPS, 1], instr_shape=[16, Q_TILE, 16]
    )
    dkv_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[NUM_WARPS, 1], instr_shape=[16, D, 16]
    )
    dq_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[NUM_WARPS, 1], instr_shape=[16, COLS, 16]
    )

    my_k = k_start + h * K_HALF
    key_pos = my_k + gl.arange(0, K_HALF, layout=gl.SliceLayout(1, s_layout))
    n_full = n_full[h]  # the first n_full visits are wholly below this warpgroup's diagonal
    k_tile = k_smem.index(h).reshape([K_HALF, D])
    v_tile = v_smem.index(h).reshape([K_HALF, D])
    dk = gl.zeros([K_HALF, D], gl.float32, layout=dkv_layout)
    dv = gl.zeros([K_HALF, D], gl.float32, layout=dkv_layout)
    s_zero = gl.zeros([K_HALF, Q_TILE], gl.float32, layout=s_layout)
    dq_zero = gl.zeros([Q_TILE, COLS], gl.float32, layout=dq_layout)

    mbarrier.wait(kv_ready.index(0), 0)
    mbarrier.wait(kv_ready.index(1), 0)
    q_last = q_lo + (n_tiles - 1) * Q_TILE
    plane = 2 * batch + h  # dQ's accumulator plane of this warpgroup's column half
    loop = (
        k_tile,
        v_tile,
        k_smem,
        q_smem,
        do_smem,
        stats_smem,
        ds_smem,
        dq_smem.index(h),
        dq_desc,
        ready,
        empty,
        ds_ready,
        ds_free,
        key_pos,
        q_last,
        qk_scale,
        scale,
        s_zero,
        dq_zero,
        plane,
    )
    dk, dv = _query_tiles(dk, dv, loop, 0, n_full, h, False)
    dk, dv = _query_tiles(dk, dv, loop, n_full, n_tiles, h, True)
    i_last = n_tiles - 1
    dq = _dq_columns(ds_smem, k_smem, ds_ready, i_last, dq_zero, h)
    dq = warpgroup_mma_wait(0, deps=[dq])
    mbarrier.arrive(ds_free.index(i_last % 2))
    reduce_dq(dq, dq_smem.index(h), dq_desc, plane, q_lo, 1.0)

    # both warpgroups' last dQ products have read both halves of K: ds_free's completion for the last visit
    mbarrier.wait(ds_free.index(i_last % 2), ds_ready_phase(i_last))
    store_dk_dv(dk, dv, 1.0, k_smem, v_smem, dk_desc, dv_desc, batch, my_k, h)


# Constexprs do not pass through warp_specialize's argument tuples: the half is fixed per function.
@gluon.jit
def _consumer0(out_descs, buffers, barriers, work):
    _consumer(0, out_descs, buffers, barriers, work)


@gluon.jit
def _consumer1(out_descs, buffers, barriers, work):
    _consumer(1, out_descs, buffers, barriers, work)


@gluon.jit
def flash_bwd_gluon_d128_kernel(
    q_desc,
    k_desc,
    v_desc,
    do_desc,
    dk_desc,
    dv_desc,
    dq_desc,
    L_ptr,
    Delta_ptr,
    stride_lb,
    stride_lq,
    N_QUERIES,
    scale: gl.constexpr,
    is_causal: gl.constexpr,
    STAGES: gl.constexpr,
    SECTION: gl.constexpr,  # heads per section of the CTAs' order (kernels.gluon_schedule)
    CONSUMER_REGS: gl.constexpr,
    PRODUCER_REGS: gl.constexpr,
):
    dtype: gl.constexpr = q_desc.dtype
    Q_TILE: gl.constexpr = q_desc.block_type.shape[1]
    K_HALF: gl.constexpr = k_desc.block_type.shape[1]
    D: gl.constexpr = q_desc.block_type.shape[2]
    COLS: gl.constexpr = dq_desc.block_type.shape[2]  # D // 2: one column half of dQ per warpgroup
    gl.static_assert(2 * COLS == D, "dQ's descriptor block holds half of its columns")
    # causal: key block 0 visits every query tile, so rank 0 (the heaviest, kernels.gluon_schedule) is block 0
    key_block, batch, _ = block_and_batch(N_QUERIES, 2 * K_HALF, SECTION)
    k_start = key_block * (2 * K_HALF)
    if is_causal:
        q_lo = (k_start // Q_TILE) * Q_TILE  # earlier query tiles see none of these keys
        n_tiles = gl.cdiv(N_QUERIES - q_lo, Q_TILE)  # >= 1: k_start < N_QUERIES
        # per warpgroup, the query tiles from q_lo up to t_diag cross (or precede) its diagonal; visited last
        # to first, the n_tiles - t_diag before them are unmasked (clamped: in the last key block the second
        # half's rows can lie wholly past N)
        n_full = (
            n_tiles - gl.minimum(gl.cdiv(k_start + K_HALF - 1 - q_lo, Q_TILE), n_tiles),
            n_tiles - gl.minimum(gl.cdiv(k_start + 2 * K_HALF - 1 - q_lo, Q_TILE), n_tiles),
        )
    else:
        q_lo = k_start * 0
        n_tiles = gl.cdiv(N_QUERIES, Q_TILE)
        n_full = (n_tiles, n_tiles)
    q_smem, do_smem, k_smem, v_smem = allocate_tiles(q_desc, k_desc, v_desc, do_desc, STAGES)
    ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([K_HALF, Q_TILE], dtype)
    ds_smem = gl.allocate_shared_memory(dtype, [4, K_HALF, Q_TILE], ds_layout)  # [half * 2 + tile parity]
    dq_smem = gl.allocate_shared_memory(gl.float32, [2, 1, Q_TILE, COLS], dq_desc.layout)
    # each slot's rows of L and D: [slot * 2 + (0 for L, 1 for D)]
    stats_smem = gl.allocate_shared_memory(
        gl.float32, [2 * STAGES, Q_TILE], gl.SwizzledSharedLayout(1, 1, 1, order=[0])
    )
    kv_ready, ready, empty, ds_ready, ds_free = allocate_barriers(STAGES, 2)  # both warpgroups read every dS

    buffers = (q_smem, do_smem, k_smem, v_smem, stats_smem, ds_smem, dq_smem)
    barriers = (kv_ready, ready, empty, ds_ready, ds_free)
    work = (batch, k_start, q_lo, n_tiles, n_full, scale * LOG2E, scale)
    consumer_args = ((dk_desc, dv_desc, dq_desc), buffers, barriers, work)
    # last to first (module docstring); q_step a tensor: constexprs do not pass through warp_specialize
    q_step = q_lo * 0 - Q_TILE
    row = batch.to(gl.int64) * stride_lb
    producer_args = (
        q_desc,
        k_desc,
        v_desc,
        do_desc,
        buffers,
        barriers,
        batch,
        k_start,
        q_lo + (n_tiles - 1) * Q_TILE,
        q_step,
        n_tiles,
        L_ptr + row,
        Delta_ptr + row,
        stride_lq,
        N_QUERIES,
    )
    gl.warp_specialize(
        [(_consumer0, consumer_args), (_consumer1, consumer_args), (_load_key_block_then_query_tiles, producer_args)],
        [4, 1],
        [CONSUMER_REGS, PRODUCER_REGS],
    )
