"""FlashAttention-2 backward for Hopper in Gluon: dQ, dK and dV in one pass (5 matmuls per tile
instead of the Triton kernels' 7), with a TMA producer warp and two consumer warpgroups that overlap
the exponentials with their matmuls.

A CTA owns key rows K^(j), V^(j) and loops over query tiles Q_i, dO_i with L_i and D_i =
rowsum(dO_i * O_i) (`flash_bwd_preprocess_kernel`, which also zeroes the fp32 dQ accumulator). In
base 2 with s = log2(e) scale, per tile, transposed so that P^T and dS^T have the key rows the CTA owns:

    S^T = K^(j) Q_i^T;   P^T = 2^(s S^T - log2(e) L_i);   dP^T = V^(j) dO_i^T;   dS^T = P^T * (dP^T - D_i)
    dV^(j) += P^T dO_i;   dK^(j) += dS^T Q_i;   dQ_i += scale * dS K^(j)   (dK scaled at the end)

dQ_i gets a part from every key block, so the parts are summed in global memory: a (Q_TILE, d) fp32
part goes from registers to shared memory and is added by TMA (`cp.reduce.async.bulk.tensor ... .add`,
`tma_reduce_add`), asynchronously and without per-thread atomics. Once both warpgroups work on a
query tile, its part is summed over the CTA's 2 K_HALF keys before it leaves the CTA:

    dQ part of tile i = dS_0 K^(j,0) + dS_1 K^(j,1)        (dS_h: warpgroup h's key rows)

computed by one warpgroup, h = i mod 2 (the *owner*), from both dS^T in shared memory. That about
halves the fp32 traffic the reduce-adds put through L2; the owners alternate, so both warpgroups do the
same work over two tiles (one owner for every tile measured slower). The owner computes tile i's part
during tile i + 1, after issuing that tile's dK product, when the other warpgroup has stored its dS^T of
tile i well before: computed in tile i, the owner waited for it every tile.

The schedule per tile, per consumer warpgroup (`tl.dot` would wait for each product as it is issued):

    L_{i+1}, D_{i+1} loads issued (one element per thread; L_i, D_i moved into the products' layout)
    issue S^T, dP^T (K and V register operands, read from shared memory once);  wait S^T
    P^T = 2^(...);  issue dV += P^T dO_i (P^T a register operand);  wait dP^T
    dS^T -> shared memory (for the owner's dQ);  issue dK += dS^T Q_i (dS^T a register operand)
    owner of tile i - 1: wait for the other's dS^T of tile i - 1;  issue its dQ part (2 products)
    wait all;  release the slot;  owner: reduce-add the dQ part (the previous reduce-add done first)

Paired tiles alternate between two dS^T buffers per warpgroup, with two mbarriers per parity: `ds_ready`
(count 2: both dS^T of a tile stored) and `ds_free` (the owner's product has read them); a warpgroup
waits on `ds_free` before overwriting a buffer the other warpgroup reads. Tiles before the second
warpgroup's first (`t_both`) are the first warpgroup's alone, their part its own dS K^(j,0).

A CTA holds 2 K_HALF key rows. A producer warp copies the K, V rows once and then Q_i, dO_i by TMA
into a ring of STAGES shared-memory slots (an mbarrier per slot counts the bytes in); two consumer
warpgroups, one per K_HALF key rows, read the same slots and release each (a second mbarrier,
count 2) once both are done with it, so one warpgroup's exponentials meet the other's matmuls.

Causal CTAs start at the query tile holding their first key (key blocks run first to last, the
longest loops first); each warpgroup skips the query tiles before its own first key and masks the
tiles that cross its diagonal. Rows past N need no mask: TMA zero-fills them in Q and dO, and L
and D load as 0 there, so those queries add P^T * 0 to dV and dS^T = P^T * (0 - 0) to dK and dQ;
key rows past N are computed but dropped by the TMA stores, as are dQ rows past N by the reduce-add.
dK and dV go out through the K and V slots, once the other warpgroup's last dQ product has read K.

P^T and dS^T as register operands gained only once the summed parts had cut the reduce-add traffic
(they had not before; docs/flash_attention_tuning.md). Loading the rows of L and D a tile ahead
shortened the whole backward: loaded in the tile that used them, their latency stood between the S^T
product and the exponentials. Causal only: without the mask an earlier version measured no faster than
the Triton kernels. Scope (`heuristics.gluon_backward_eligible`, `launch.dispatch.rule_choices`): that of
the Gluon forward, causal, d = 64. The handshake between the warpgroups is replayed on the CPU by
tests/test_flash_gluon_handshake.py.
"""

from __future__ import annotations

from triton._C.libtriton import ir
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language._core import builtin
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from cs336_systems.attention.kernels.gluon_schedule import block_and_batch
from cs336_systems.attention.kernels.triton_forward import LOG2E  # gl.constexpr is tl.constexpr


@builtin
def tma_reduce_add(tensor_desc, coord, src, _semantic=None):
    """global[coord ...] += src by TMA (`cp.reduce.async.bulk.tensor ... .add`): Triton's `tl` descriptor
    atomic_add, which Gluon 3.6's `tma` module does not wrap. Completes like a TMA store (`tma.store_wait`)."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle)


@gluon.jit
def load_key_block(k_desc, v_desc, k_smem, v_smem, kv_ready, batch, k_start):
    """Both halves of the CTA's K and V rows by TMA, half h announced on kv_ready[h]."""
    K_HALF: gl.constexpr = k_desc.block_type.shape[1]
    for h in gl.static_range(2):
        mbarrier.expect(kv_ready.index(h), k_desc.block_type.nbytes + v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [batch, k_start + h * K_HALF, 0], kv_ready.index(h), k_smem.index(h))
        tma.async_copy_global_to_shared(v_desc, [batch, k_start + h * K_HALF, 0], kv_ready.index(h), v_smem.index(h))


@gluon.jit
def load_key_block_then_query_tiles(
    q_desc, k_desc, v_desc, do_desc, buffers, barriers, batch, k_start, q_first, q_step, n_tiles
):
    """Both halves of K and V, then Q_i and dO_i of the t-th query tile visited, rows from q_first + t q_step,
    into slot t % STAGES once both consumers have released it."""
    q_smem, do_smem, k_smem, v_smem = buffers[0], buffers[1], buffers[2], buffers[3]
    kv_ready, ready, empty = barriers[0], barriers[1], barriers[2]
    STAGES: gl.constexpr = q_smem.shape[0]
    load_key_block(k_desc, v_desc, k_smem, v_smem, kv_ready, batch, k_start)
    for t in range(n_tiles):
        slot = t % STAGES
        mbarrier.wait(empty.index(slot), ((t // STAGES) & 1) ^ 1)
        mbarrier.expect(ready.index(slot), q_desc.block_type.nbytes + do_desc.block_type.nbytes)
        q_start = q_first + t * q_step
        tma.async_copy_global_to_shared(q_desc, [batch, q_start, 0], ready.index(slot), q_smem.index(slot))
        tma.async_copy_global_to_shared(do_desc, [batch, q_start, 0], ready.index(slot), do_smem.index(slot))


@gluon.jit
def fused_step(
    k_op,
    v_op,
    q_tile,
    do_tile,
    ds_buf,
    dk,
    dv,
    lse2,
    delta,
    key_pos,
    query_pos,
    qk_scale,
    s_zero,
    wait_free,
    free_bar,
    free_phase,
    MASKED: gl.constexpr,
):
    """One query tile up to dK's product: S^T, P^T, dP^T, dS^T (stored for the owner's dQ product once
    `free_bar` says the buffer is free), dV's and dK's products issued; returns their tokens."""
    s_token = warpgroup_mma(k_op, q_tile.permute((1, 0)), s_zero, use_acc=False, is_async=True)
    dp_token = warpgroup_mma(v_op, do_tile.permute((1, 0)), s_zero, use_acc=False, is_async=True)
    s_t = warpgroup_mma_wait(1, deps=[s_token])
    p_t = gl.exp2(s_t * qk_scale - lse2[None, :])
    if MASKED:
        p_t = gl.where(key_pos[:, None] <= query_pos[None, :], p_t, 0.0)
    # the accumulator's layout is the register operand's: converting P^T moves no data between threads
    p_op = gl.convert_layout(
        p_t.to(q_tile.dtype), gl.DotOperandLayout(operand_index=0, parent=dv.type.layout, k_width=2)
    )
    dv_token = warpgroup_mma(p_op, do_tile, dv, is_async=True)
    dp_t = warpgroup_mma_wait(1, deps=[dp_token])
    ds_t = (p_t * (dp_t - delta[None, :])).to(q_tile.dtype)
    if wait_free:  # the other warpgroup owns this buffer's tiles: its product for the one before has run
        mbarrier.wait(free_bar, free_phase)
    ds_buf.store(ds_t)
    fence_async_shared()
    ds_op = gl.convert_layout(ds_t, gl.DotOperandLayout(operand_index=0, parent=dk.type.layout, k_width=2))
    dk_token = warpgroup_mma(ds_op, q_tile, dk, is_async=True)
    return dk_token, dv_token


@gluon.jit
def reduce_dq(dq, dq_buf, dq_desc, plane, q_start, scale):
    """dQ[plane, q_start:q_start + Q_TILE] += scale * dq, through dq_buf and a TMA reduce-add."""
    tma.store_wait(0)  # the previous reduce-add has read dq_buf
    dq_buf.reshape([dq.shape[0], dq.shape[1]]).store(dq * scale)
    fence_async_shared()
    tma_reduce_add(dq_desc, [plane, q_start, 0], dq_buf)


@gluon.jit
def allocate_tiles(q_desc, k_desc, v_desc, do_desc, STAGES: gl.constexpr):
    """Shared memory for the ring of STAGES (Q_i, dO_i) slots and the CTA's two halves of K and V, each in
    its descriptor's swizzled layout."""
    dtype: gl.constexpr = q_desc.dtype
    Q_TILE: gl.constexpr = q_desc.block_type.shape[1]
    K_HALF: gl.constexpr = k_desc.block_type.shape[1]
    D: gl.constexpr = q_desc.block_type.shape[2]
    q_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, Q_TILE, D], q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, Q_TILE, D], do_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [2, 1, K_HALF, D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [2, 1, K_HALF, D], v_desc.layout)
    return q_smem, do_smem, k_smem, v_smem


@gluon.jit
def allocate_barriers(STAGES: gl.constexpr, DS_FREE_COUNT: gl.constexpr):
    """The backward's mbarriers, initialised: kv_ready (one per key half, bytes in), ready/empty per slot
    (the slot's bytes in; both consumers released it), ds_ready (both warpgroups' dS of a tile parity stored)
    and ds_free (its readers done, `DS_FREE_COUNT` of them)."""
    kv_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    ds_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    ds_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(kv_ready.index(i), count=1)
        mbarrier.init(ds_ready.index(i), count=2)
        mbarrier.init(ds_free.index(i), count=DS_FREE_COUNT)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)
    fence_async_shared()
    return kv_ready, ready, empty, ds_ready, ds_free


@gluon.jit
def store_dk_dv(dk, dv, scale, k_smem, v_smem, dk_desc, dv_desc, batch, my_k, h: gl.constexpr):
    """dK (scaled) and dV of key half h out through its K and V slots by TMA (K's readers must be done)."""
    K_HALF: gl.constexpr = k_smem.shape[2]
    D: gl.constexpr = k_smem.shape[3]
    k_smem.index(h).reshape([K_HALF, D]).store((dk * scale).to(k_smem.dtype))
    v_smem.index(h).reshape([K_HALF, D]).store(dv.to(v_smem.dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(dk_desc, [batch, my_k, 0], k_smem.index(h))
    tma.async_copy_shared_to_global(dv_desc, [batch, my_k, 0], v_smem.index(h))
    tma.store_wait(0)


@gluon.jit
def row_stats(L_row, Delta_row, stride_lq, pos, N_QUERIES):
    """L and D at query positions `pos` (0 outside [0, N): rows past N then add nothing, module docstring)."""
    inside = (pos >= 0) & (pos < N_QUERIES)
    lse = gl.load(L_row + pos * stride_lq, mask=inside, other=0.0)
    delta = gl.load(Delta_row + pos * stride_lq, mask=inside, other=0.0)
    return lse, delta


@gluon.jit
def _paired_before(t, b, t_both):
    """How many paired tiles (index >= t_both) of parity b come before tile t."""
    return (t - b + 1) // 2 - (t_both - b + 1) // 2


@gluon.jit
def _paired_dq(ds_smem, k_smem, ds_ready, b, phase, dq_zero):
    """Issues the dQ part of a paired tile of parity b, dS_0 K^(j,0) + dS_1 K^(j,1), once both dS^T are
    stored (`ds_ready` at `phase`); returns its token."""
    K_HALF: gl.constexpr = k_smem.shape[2]
    D: gl.constexpr = k_smem.shape[3]
    mbarrier.wait(ds_ready.index(b), phase)
    dq = warpgroup_mma(
        ds_smem.index(b).permute((1, 0)), k_smem.index(0).reshape([K_HALF, D]), dq_zero, use_acc=False, is_async=True
    )
    return warpgroup_mma(ds_smem.index(2 + b).permute((1, 0)), k_smem.index(1).reshape([K_HALF, D]), dq, is_async=True)


@gluon.jit
def _query_tiles(dk, dv, loop, t_lo, t_hi, H: gl.constexpr, MASKED: gl.constexpr):
    """dK, dV over query tiles [t_lo, t_hi). Tiles from t_both on are processed by both warpgroups; the
    dQ part of such a tile, both halves' dS^T times K over all 2 K_HALF keys, is computed by the warpgroup
    whose index is the tile's parity, during its next tile, and reduce-added; earlier tiles are this
    warpgroup's alone."""
    (
        k_smem,
        k_op,
        v_op,
        q_smem,
        do_smem,
        ds_smem,
        dq_buf,
        dq_desc,
        ready,
        empty,
        ds_ready,
        ds_free,
        L_row,
        Delta_row,
        stride_lq,
        key_pos,
        q_lo,
        N_QUERIES,
        qk_scale,
        scale,
        s_zero,
        dq_zero,
        batch,
        t_both,
    ) = loop
    STAGES: gl.constexpr = q_smem.shape[0]
    Q_TILE: gl.constexpr = q_smem.shape[2]
    D: gl.constexpr = q_smem.shape[3]
    K_HALF: gl.constexpr = k_smem.shape[2]
    cols = gl.arange(0, Q_TILE, layout=gl.SliceLayout(0, s_zero.type.layout))
    # the next tile's rows of L and D are loaded a tile ahead, one element per thread (not the 16 of the
    # products' layout, which spilled), and moved into the products' layout when used
    flat: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    flat_cols = gl.arange(0, Q_TILE, layout=flat)
    lse_next, delta_next = row_stats(L_row, Delta_row, stride_lq, q_lo + t_lo * Q_TILE + flat_cols, N_QUERIES)
    for t in range(t_lo, t_hi):
        slot = t % STAGES
        b = t % 2
        q_start = q_lo + t * Q_TILE
        query_pos = q_start + cols
        lse2 = gl.convert_layout(lse_next, cols.type.layout) * LOG2E
        delta = gl.convert_layout(delta_next, cols.type.layout)
        lse_next, delta_next = row_stats(L_row, Delta_row, stride_lq, q_start + Q_TILE + flat_cols, N_QUERIES)
        paired = t >= t_both
        ds_buf = ds_smem.index(2 * H + b)
        q_tile = q_smem.index(slot).reshape([Q_TILE, D])
        do_tile = do_smem.index(slot).reshape([Q_TILE, D])
        mbarrier.wait(ready.index(slot), (t // STAGES) & 1)
        dk_token, dv_token = fused_step(
            k_op,
            v_op,
            q_tile,
            do_tile,
            ds_buf,
            dk,
            dv,
            lse2,
            delta,
            key_pos,
            query_pos,
            qk_scale,
            s_zero,
            paired & (b != H),
            ds_free.index(b),
            (_paired_before(t, b, t_both) - 1) & 1,
            MASKED,
        )
        if paired:
            mbarrier.arrive(ds_ready.index(b))
        if ((t - 1) >= t_both) & (b != H):  # the previous tile is paired and this warpgroup's: its dQ part
            pb = 1 - b
            dq = _paired_dq(ds_smem, k_smem, ds_ready, pb, _paired_before(t - 1, pb, t_both) & 1, dq_zero)
            dv, dk, dq = warpgroup_mma_wait(0, deps=[dv_token, dk_token, dq])
            mbarrier.arrive(ds_free.index(pb))
            mbarrier.arrive(empty.index(slot))
            reduce_dq(dq, dq_buf, dq_desc, batch, q_start - Q_TILE, scale)
        else:
            dv, dk = warpgroup_mma_wait(0, deps=[dv_token, dk_token])
            mbarrier.arrive(empty.index(slot))
        if not paired:
            dq = warpgroup_mma(
                ds_buf.permute((1, 0)), k_smem.index(H).reshape([K_HALF, D]), dq_zero, use_acc=False, is_async=True
            )
            dq = warpgroup_mma_wait(0, deps=[dq])
            reduce_dq(dq, dq_buf, dq_desc, batch, q_start, scale)
    return dk, dv


@gluon.jit
def _consumer(h: gl.constexpr, out_descs, buffers, barriers, work):
    """Key rows [k_start + h K_HALF, + K_HALF): the loop over query tiles, then dK and dV."""
    L_ptr, Delta_ptr, stride_lb, stride_lq, batch, k_start, q_lo, n_tiles, N_QUERIES, qk_scale, scale = work
    dk_desc, dv_desc, dq_desc = out_descs
    q_smem, do_smem, k_smem, v_smem, ds_smem, dq_smem = buffers
    kv_ready, ready, empty, ds_ready, ds_free = barriers
    NUM_WARPS: gl.constexpr = 4
    STAGES: gl.constexpr = q_smem.shape[0]
    Q_TILE: gl.constexpr = q_smem.shape[2]
    K_HALF: gl.constexpr = k_smem.shape[2]
    D: gl.constexpr = q_smem.shape[3]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[NUM_WARPS, 1], instr_shape=[16, Q_TILE, 16]
    )
    dkv_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[NUM_WARPS, 1], instr_shape=[16, D, 16]
    )

    my_k = k_start + h * K_HALF
    key_pos = my_k + gl.arange(0, K_HALF, layout=gl.SliceLayout(1, s_layout))
    # Tiles before t_first see none of these keys, tiles before t_full cross their diagonal. Clamped: in the
    # last key block these rows can lie wholly past N, beyond the last query tile.
    t_first = gl.minimum((my_k - q_lo) // Q_TILE, n_tiles)
    t_full = gl.minimum(gl.cdiv(my_k + K_HALF - 1 - q_lo, Q_TILE), n_tiles)
    t_both = gl.minimum((k_start + K_HALF - q_lo) // Q_TILE, n_tiles)  # the second half's t_first
    k_tile = k_smem.index(h).reshape([K_HALF, D])
    v_tile = v_smem.index(h).reshape([K_HALF, D])
    L_row = L_ptr + batch.to(gl.int64) * stride_lb
    Delta_row = Delta_ptr + batch.to(gl.int64) * stride_lb
    dk = gl.zeros([K_HALF, D], gl.float32, layout=dkv_layout)
    dv = gl.zeros([K_HALF, D], gl.float32, layout=dkv_layout)
    s_zero = gl.zeros([K_HALF, Q_TILE], gl.float32, layout=s_layout)
    dq_zero = gl.zeros([Q_TILE, D], gl.float32, layout=dkv_layout)

    mbarrier.wait(kv_ready.index(0), 0)
    mbarrier.wait(kv_ready.index(1), 0)
    # K and V as register operands of S^T and dP^T: those products then read only Q and dO from shared memory
    k_op = k_tile.load(gl.DotOperandLayout(operand_index=0, parent=s_layout, k_width=2))
    v_op = v_tile.load(gl.DotOperandLayout(operand_index=0, parent=s_layout, k_width=2))
    loop = (
        k_smem,
        k_op,
        v_op,
        q_smem,
        do_smem,
        ds_smem,
        dq_smem.index(h),
        dq_desc,
        ready,
        empty,
        ds_ready,
        ds_free,
        L_row,
        Delta_row,
        stride_lq,
        key_pos,
        q_lo,
        N_QUERIES,
        qk_scale,
        scale,
        s_zero,
        dq_zero,
        batch,
        t_both,
    )
    for t in range(t_first):
        slot = t % STAGES
        mbarrier.wait(ready.index(slot), (t // STAGES) & 1)
        mbarrier.arrive(empty.index(slot))
    dk, dv = _query_tiles(dk, dv, loop, t_first, t_full, h, True)
    dk, dv = _query_tiles(dk, dv, loop, t_full, n_tiles, h, False)
    t_last = n_tiles - 1
    if (t_last >= t_both) & (t_last % 2 == h):  # the last tile's dQ part: there is no next tile to compute it in
        b_last = t_last % 2
        dq = _paired_dq(ds_smem, k_smem, ds_ready, b_last, _paired_before(t_last, b_last, t_both) & 1, dq_zero)
        dq = warpgroup_mma_wait(0, deps=[dq])
        mbarrier.arrive(ds_free.index(b_last))
        reduce_dq(dq, dq_smem.index(h), dq_desc, batch, q_lo + t_last * Q_TILE, scale)

    # the other warpgroup's last dQ product has read this half of K
    other: gl.constexpr = 1 - h
    mbarrier.wait(ds_free.index(other), (_paired_before(n_tiles, other, t_both) - 1) & 1)
    store_dk_dv(dk, dv, scale, k_smem, v_smem, dk_desc, dv_desc, batch, my_k, h)


# Constexprs do not pass through warp_specialize's argument tuples: the half is fixed per function.
@gluon.jit
def _consumer0(out_descs, buffers, barriers, work):
    _consumer(0, out_descs, buffers, barriers, work)


@gluon.jit
def _consumer1(out_descs, buffers, barriers, work):
    _consumer(1, out_descs, buffers, barriers, work)


@gluon.jit
def flash_bwd_gluon_kernel(
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
    STAGES: gl.constexpr,
    SECTION: gl.constexpr,  # heads per section of the CTAs' order (kernels.gluon_schedule)
    CONSUMER_REGS: gl.constexpr,
    PRODUCER_REGS: gl.constexpr,
):
    dtype: gl.constexpr = q_desc.dtype
    Q_TILE: gl.constexpr = q_desc.block_type.shape[1]
    K_HALF: gl.constexpr = k_desc.block_type.shape[1]
    D: gl.constexpr = q_desc.block_type.shape[2]
    # causal: key block 0 visits every query tile, so rank 0 (the heaviest, kernels.gluon_schedule) is block 0
    key_block, batch, _ = block_and_batch(N_QUERIES, 2 * K_HALF, SECTION)
    k_start = key_block * (2 * K_HALF)
    q_lo = (k_start // Q_TILE) * Q_TILE  # causal: earlier query tiles see none of these keys
    n_tiles = gl.cdiv(N_QUERIES - q_lo, Q_TILE)

    q_smem, do_smem, k_smem, v_smem = allocate_tiles(q_desc, k_desc, v_desc, do_desc, STAGES)
    ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([K_HALF, Q_TILE], dtype)
    ds_smem = gl.allocate_shared_memory(dtype, [4, K_HALF, Q_TILE], ds_layout)  # [half * 2 + tile parity]
    dq_smem = gl.allocate_shared_memory(gl.float32, [2, 1, Q_TILE, D], dq_desc.layout)
    kv_ready, ready, empty, ds_ready, ds_free = allocate_barriers(STAGES, 1)  # one reader: the owner

    buffers = (q_smem, do_smem, k_smem, v_smem, ds_smem, dq_smem)
    barriers = (kv_ready, ready, empty, ds_ready, ds_free)
    work = (L_ptr, Delta_ptr, stride_lb, stride_lq, batch, k_start, q_lo, n_tiles, N_QUERIES, scale * LOG2E, scale)
    consumer_args = ((dk_desc, dv_desc, dq_desc), buffers, barriers, work)
    q_step = q_lo * 0 + Q_TILE  # a tensor: constexprs do not pass through warp_specialize
    producer_args = (q_desc, k_desc, v_desc, do_desc, buffers, barriers, batch, k_start, q_lo, q_step, n_tiles)
    gl.warp_specialize(
        [(_consumer0, consumer_args), (_consumer1, consumer_args), (load_key_block_then_query_tiles, producer_args)],
        [4, 1],
        [CONSUMER_REGS, PRODUCER_REGS],
    )
