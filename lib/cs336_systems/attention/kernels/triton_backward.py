"""FlashAttention-2 backward kernels in Triton (Algorithm 2 of the handout, split in two passes).

With D = rowsum(dO * O) and L from the forward, each tile of P is recomputed:

    S = Q_i K^(j)T * scale,   P = exp(S - L_i),   dP = dO_i V^(j)T,   dS = P * (dP - D_i)
    dV^(j) += P^T dO_i,   dK^(j) += dS^T Q_i * scale,   dQ_i += dS K^(j) * scale

Algorithm 2 updates dQ_i from every key tile, which needs atomics. Here P is recomputed twice
instead: `flash_bwd_dkdv_kernel` (one program per key tile, looping over query tiles) owns
dK^(j), dV^(j), and `flash_bwd_dq_kernel` (one program per query tile, looping over key tiles)
owns dQ_i, so no two programs write the same tile. The dQ kernel runs first: with O_i and dO_i
loaded anyway it computes D_i (one row-sum per query tile) and stores it for the dK/dV kernel,
so D costs no pass over O and dO of its own. Where the grid has fewer programs than the GPU has SMs
(fp32, one head: `heuristics.backward_split`), each kernel's loop is split into chunks, one program
each (grid axis 2, SPLIT), whose partial dK, dV or dQ add into zeroed fp32 gradients by atomics: there
the longest program's loop, not the work, was the latency. The key-tile program computes the
transposed tiles S^T = K^(j) Q_i^T directly, so P^T and dS^T come out as the products
dV += P^T dO and dK += dS^T Q take them, and no (K_TILE, Q_TILE) tile is ever transposed.

Masking, as in the forward kernel: each loop is split into full tiles (every pair visible, no
padding: no mask computed) and masked tiles (the causal diagonal and ragged edge tiles), where
entries with a padded query or key or, when causal, a key after its query (query r sees keys
c <= r, upper-left aligned as in `scaled_dot_product_attention`; keys c >= N_QUERIES are seen by
no query and get dK = dV = 0) get P = 0. Tiles where every entry is masked are skipped.
Base-2 exponentials as in the forward kernel.
"""

from __future__ import annotations

import triton
import triton.language as tl

from cs336_systems.attention.kernels.triton_forward import LOG2E
from cs336_systems.attention.kernels.triton_tiles import load_rows, row_source


@triton.jit
def _dkdv_query_tiles(
    dk,
    dv,
    k,
    v,
    Q_source,
    dO_source,
    batch_index,
    L_ptr,
    Delta_ptr,
    stride_lq,
    q_lo,
    q_hi,
    key_pos,
    qk_scale,
    N_QUERIES,
    Q_TILE_SIZE: tl.constexpr,
    D_TILE: tl.constexpr,
    MASKED: tl.constexpr,
    is_causal: tl.constexpr,
    EVEN_D: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    USE_TMA: tl.constexpr,
):
    """Accumulate dK^(j), dV^(j) over query tiles [q_lo, q_hi); masks only when MASKED."""
    for q_start in range(q_lo, q_hi, Q_TILE_SIZE):
        q = load_rows(Q_source, batch_index, q_start, Q_TILE_SIZE, D_TILE, MASKED, EVEN_D, USE_TMA)
        do = load_rows(dO_source, batch_index, q_start, Q_TILE_SIZE, D_TILE, MASKED, EVEN_D, USE_TMA)
        query_index = q_start + tl.arange(0, Q_TILE_SIZE)
        if MASKED:
            in_range = query_index < N_QUERIES
            lse = tl.load(L_ptr + query_index * stride_lq, mask=in_range, other=0.0)
            delta = tl.load(Delta_ptr + query_index * stride_lq, mask=in_range, other=0.0)
        else:
            lse = tl.load(L_ptr + query_index * stride_lq)
            delta = tl.load(Delta_ptr + query_index * stride_lq)

        s_t = tl.dot(k, tl.trans(q), input_precision=INPUT_PRECISION)  # (K_TILE, Q_TILE)
        p_t = tl.math.exp2(s_t * qk_scale - lse[None, :] * LOG2E)
        if MASKED:
            keep = query_index[None, :] < N_QUERIES
            if is_causal:
                keep = keep & (key_pos[:, None] <= query_index[None, :])
            p_t = tl.where(keep, p_t, 0.0)

        dv = tl.dot(p_t.to(do.dtype), do, acc=dv, input_precision=INPUT_PRECISION)
        dp_t = tl.dot(v, tl.trans(do), input_precision=INPUT_PRECISION)
        ds_t = p_t * (dp_t - delta[None, :])
        dk = tl.dot(ds_t.to(q.dtype), q, acc=dk, input_precision=INPUT_PRECISION)
    return dk, dv


@triton.jit
def flash_bwd_dkdv_kernel(
    Q_ptr,
    K_ptr,
    V_ptr,
    dO_ptr,
    L_ptr,
    Delta_ptr,
    dK_ptr,
    dV_ptr,
    stride_qb,
    stride_qq,
    stride_qd,
    stride_kb,
    stride_kk,
    stride_kd,
    stride_vb,
    stride_vk,
    stride_vd,
    stride_dob,
    stride_doq,
    stride_dod,
    stride_lb,
    stride_lq,
    stride_dkb,
    stride_dkk,
    stride_dkd,
    stride_dvb,
    stride_dvk,
    stride_dvd,
    N_QUERIES,
    N_KEYS,
    Q_CHUNK,
    scale: tl.constexpr,  # constexpr: a runtime float becomes fp64 under torch.compile, making S fp64
    D: tl.constexpr,
    D_TILE: tl.constexpr,
    Q_TILE_SIZE: tl.constexpr,
    K_TILE_SIZE: tl.constexpr,
    is_causal: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    USE_TMA: tl.constexpr,
    SPLIT: tl.constexpr = False,
):
    """dK^(j), dV^(j) of one key tile. SPLIT: grid axis 2 splits the query tiles into chunks of Q_CHUNK
    rows (a multiple of Q_TILE_SIZE), each program adding its chunk's share into zeroed fp32 dK, dV
    (`atomic_add`); else one program takes every query tile and stores."""
    key_tile_index = tl.program_id(0)  # causal: tile 0 sees every query, so the heaviest programs start first
    tile_batch = tl.program_id(1)
    batch_index = tile_batch.to(tl.int64)
    k_start = key_tile_index * K_TILE_SIZE
    EVEN_D: tl.constexpr = D == D_TILE

    # Query tiles: masked [q_lo, q_full), full [q_full, q_full_end), masked [q_full_end, N_QUERIES).
    # A causal key tile past the last query (k_start >= N_QUERIES) finds no visible entry and stores dK = dV = 0.
    q_lo = 0
    q_full = 0
    if is_causal:
        # The first query tile holding a query at or after this tile's first key ...
        q_lo = (k_start // Q_TILE_SIZE) * Q_TILE_SIZE
        # ... and the first whose every query is at or after this tile's last key.
        q_full = q_lo + tl.cdiv(k_start + K_TILE_SIZE - 1 - q_lo, Q_TILE_SIZE) * Q_TILE_SIZE
    q_full_end = q_full + (tl.maximum(N_QUERIES - q_full, 0) // Q_TILE_SIZE) * Q_TILE_SIZE
    q_stop = N_QUERIES
    if SPLIT:  # this program's chunk of each range
        chunk_lo = tl.program_id(2) * Q_CHUNK
        chunk_hi = chunk_lo + Q_CHUNK
        q_stop = tl.minimum(q_stop, chunk_hi)
        q_full_end = tl.minimum(q_full_end, chunk_hi)
        q_full = tl.minimum(q_full, chunk_hi)
        q_lo = tl.maximum(q_lo, chunk_lo)
        q_mid = tl.maximum(q_full, chunk_lo)
        q_tail = tl.maximum(q_full_end, chunk_lo)
    else:
        q_mid = q_full
        q_tail = q_full_end

    K_source = row_source(K_ptr, tile_batch, stride_kb, stride_kk, stride_kd, N_KEYS, D, K_TILE_SIZE, D_TILE, USE_TMA)
    V_source = row_source(V_ptr, tile_batch, stride_vb, stride_vk, stride_vd, N_KEYS, D, K_TILE_SIZE, D_TILE, USE_TMA)
    Q_source = row_source(
        Q_ptr, tile_batch, stride_qb, stride_qq, stride_qd, N_QUERIES, D, Q_TILE_SIZE, D_TILE, USE_TMA
    )
    dO_source = row_source(
        dO_ptr, tile_batch, stride_dob, stride_doq, stride_dod, N_QUERIES, D, Q_TILE_SIZE, D_TILE, USE_TMA
    )
    L_row_ptr = L_ptr + batch_index * stride_lb
    Delta_row_ptr = Delta_ptr + batch_index * stride_lb

    # Padded key rows (past N_KEYS) load as zeros; their dK, dV rows are never stored, and no
    # other row depends on them, so the key side needs no mask.
    k = load_rows(K_source, tile_batch, k_start, K_TILE_SIZE, D_TILE, True, EVEN_D, USE_TMA)
    v = load_rows(V_source, tile_batch, k_start, K_TILE_SIZE, D_TILE, True, EVEN_D, USE_TMA)
    dk = tl.zeros((K_TILE_SIZE, D_TILE), dtype=tl.float32)
    dv = tl.zeros((K_TILE_SIZE, D_TILE), dtype=tl.float32)
    qk_scale = scale * LOG2E
    key_pos = k_start + tl.arange(0, K_TILE_SIZE)

    dk, dv = _dkdv_query_tiles(
        dk,
        dv,
        k,
        v,
        Q_source,
        dO_source,
        tile_batch,
        L_row_ptr,
        Delta_row_ptr,
        stride_lq,
        q_lo,
        tl.minimum(q_full, q_stop),
        key_pos,
        qk_scale,
        N_QUERIES,
        Q_TILE_SIZE,
        D_TILE,
        True,
        is_causal,
        EVEN_D,
        INPUT_PRECISION,
        USE_TMA,
    )
    dk, dv = _dkdv_query_tiles(
        dk,
        dv,
        k,
        v,
        Q_source,
        dO_source,
        tile_batch,
        L_row_ptr,
        Delta_row_ptr,
        stride_lq,
        q_mid,
        q_full_end,
        key_pos,
        qk_scale,
        N_QUERIES,
        Q_TILE_SIZE,
        D_TILE,
        False,
        is_causal,
        EVEN_D,
        INPUT_PRECISION,
        USE_TMA,
    )
    dk, dv = _dkdv_query_tiles(
        dk,
        dv,
        k,
        v,
        Q_source,
        dO_source,
        tile_batch,
        L_row_ptr,
        Delta_row_ptr,
        stride_lq,
        q_tail,
        q_stop,
        key_pos,
        qk_scale,
        N_QUERIES,
        Q_TILE_SIZE,
        D_TILE,
        True,
        is_causal,
        EVEN_D,
        INPUT_PRECISION,
        USE_TMA,
    )

    if SPLIT:
        cols = tl.arange(0, D_TILE)
        inside = (key_pos[:, None] < N_KEYS) & (cols[None, :] < D)
        tl.atomic_add(
            dK_ptr + batch_index * stride_dkb + key_pos[:, None] * stride_dkk + cols[None, :] * stride_dkd,
            dk * scale,
            mask=inside,
            sem="relaxed",
        )
        tl.atomic_add(
            dV_ptr + batch_index * stride_dvb + key_pos[:, None] * stride_dvk + cols[None, :] * stride_dvd,
            dv,
            mask=inside,
            sem="relaxed",
        )
        return

    dK_block_ptr = tl.make_block_ptr(
        dK_ptr + batch_index * stride_dkb,
        shape=(N_KEYS, D),
        strides=(stride_dkk, stride_dkd),
        offsets=(k_start, 0),
        block_shape=(K_TILE_SIZE, D_TILE),
        order=(1, 0),
    )
    dV_block_ptr = tl.make_block_ptr(
        dV_ptr + batch_index * stride_dvb,
        shape=(N_KEYS, D),
        strides=(stride_dvk, stride_dvd),
        offsets=(k_start, 0),
        block_shape=(K_TILE_SIZE, D_TILE),
        order=(1, 0),
    )
    tl.store(dK_block_ptr, (dk * scale).to(dK_ptr.dtype.element_ty), boundary_check=(0, 1))
    tl.store(dV_block_ptr, dv.to(dV_ptr.dtype.element_ty), boundary_check=(0, 1))


@triton.jit
def _dq_key_tiles(
    dq,
    q,
    do,
    lse,
    delta,
    K_source,
    V_source,
    batch_index,
    k_lo,
    k_hi,
    query_pos,
    qk_scale,
    N_KEYS,
    K_TILE_SIZE: tl.constexpr,
    D_TILE: tl.constexpr,
    MASKED: tl.constexpr,
    is_causal: tl.constexpr,
    EVEN_D: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    USE_TMA: tl.constexpr,
):
    """Accumulate dQ_i over key tiles [k_lo, k_hi); masks only when MASKED."""
    lse2 = lse * LOG2E
    for k_start in range(k_lo, k_hi, K_TILE_SIZE):
        k = load_rows(K_source, batch_index, k_start, K_TILE_SIZE, D_TILE, MASKED, EVEN_D, USE_TMA)
        v = load_rows(V_source, batch_index, k_start, K_TILE_SIZE, D_TILE, MASKED, EVEN_D, USE_TMA)
        s = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION)
        p = tl.math.exp2(s * qk_scale - lse2[:, None])
        if MASKED:
            key_pos = k_start + tl.arange(0, K_TILE_SIZE)
            keep = key_pos[None, :] < N_KEYS
            if is_causal:
                keep = keep & (key_pos[None, :] <= query_pos[:, None])
            p = tl.where(keep, p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=INPUT_PRECISION)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, acc=dq, input_precision=INPUT_PRECISION)
    return dq


@triton.jit
def flash_bwd_dq_kernel(
    Q_ptr,
    K_ptr,
    V_ptr,
    O_ptr,
    dO_ptr,
    L_ptr,
    Delta_ptr,
    dQ_ptr,
    stride_qb,
    stride_qq,
    stride_qd,
    stride_kb,
    stride_kk,
    stride_kd,
    stride_vb,
    stride_vk,
    stride_vd,
    stride_ob,
    stride_oq,
    stride_od,
    stride_dob,
    stride_doq,
    stride_dod,
    stride_lb,
    stride_lq,
    stride_dqb,
    stride_dqq,
    stride_dqd,
    N_QUERIES,
    N_KEYS,
    K_CHUNK,
    scale: tl.constexpr,  # constexpr: a runtime float becomes fp64 under torch.compile, making S fp64
    D: tl.constexpr,
    D_TILE: tl.constexpr,
    Q_TILE_SIZE: tl.constexpr,
    K_TILE_SIZE: tl.constexpr,
    is_causal: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    USE_TMA: tl.constexpr,
    SPLIT: tl.constexpr = False,
):
    """dQ_i and D_i of one query tile. SPLIT: grid axis 2 splits the key tiles into chunks of K_CHUNK
    rows (a multiple of K_TILE_SIZE), each program adding its chunk's share into a zeroed fp32 dQ
    (`atomic_add`), the first chunk's program storing D_i; else one program takes every key tile."""
    query_tile_index = tl.program_id(0)
    if is_causal:
        query_tile_index = tl.num_programs(0) - 1 - query_tile_index  # the longest loops first
    tile_batch = tl.program_id(1)
    batch_index = tile_batch.to(tl.int64)
    q_start = query_tile_index * Q_TILE_SIZE
    EVEN_D: tl.constexpr = D == D_TILE

    Q_source = row_source(
        Q_ptr, tile_batch, stride_qb, stride_qq, stride_qd, N_QUERIES, D, Q_TILE_SIZE, D_TILE, USE_TMA
    )
    dO_source = row_source(
        dO_ptr, tile_batch, stride_dob, stride_doq, stride_dod, N_QUERIES, D, Q_TILE_SIZE, D_TILE, USE_TMA
    )
    O_source = row_source(
        O_ptr, tile_batch, stride_ob, stride_oq, stride_od, N_QUERIES, D, Q_TILE_SIZE, D_TILE, USE_TMA
    )
    K_source = row_source(K_ptr, tile_batch, stride_kb, stride_kk, stride_kd, N_KEYS, D, K_TILE_SIZE, D_TILE, USE_TMA)
    V_source = row_source(V_ptr, tile_batch, stride_vb, stride_vk, stride_vd, N_KEYS, D, K_TILE_SIZE, D_TILE, USE_TMA)

    query_index = q_start + tl.arange(0, Q_TILE_SIZE)
    in_range = query_index < N_QUERIES
    q = load_rows(Q_source, tile_batch, q_start, Q_TILE_SIZE, D_TILE, True, EVEN_D, USE_TMA)
    do = load_rows(dO_source, tile_batch, q_start, Q_TILE_SIZE, D_TILE, True, EVEN_D, USE_TMA)
    lse = tl.load(L_ptr + batch_index * stride_lb + query_index * stride_lq, mask=in_range, other=0.0)
    # D_i = rowsum(dO_i * O_i), stored for the dK/dV kernel that runs next.
    o = load_rows(O_source, tile_batch, q_start, Q_TILE_SIZE, D_TILE, True, EVEN_D, USE_TMA)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    tl.store(
        Delta_ptr + batch_index * stride_lb + query_index * stride_lq, delta, mask=in_range & (tl.program_id(2) == 0)
    )
    dq = tl.zeros((Q_TILE_SIZE, D_TILE), dtype=tl.float32)
    qk_scale = scale * LOG2E

    # Padded query rows (past N_QUERIES) are never stored: only the key side is masked.
    k_full = (N_KEYS // K_TILE_SIZE) * K_TILE_SIZE
    k_stop = N_KEYS
    if is_causal:
        k_full = tl.minimum(k_full, ((q_start + 1) // K_TILE_SIZE) * K_TILE_SIZE)
        k_stop = tl.minimum(N_KEYS, q_start + Q_TILE_SIZE)
    k_lo = 0
    k_masked = k_full
    if SPLIT:  # this program's chunk of each range
        k_lo = tl.program_id(2) * K_CHUNK
        k_stop = tl.minimum(k_stop, k_lo + K_CHUNK)
        k_full = tl.minimum(k_full, k_lo + K_CHUNK)
        k_masked = tl.maximum(k_full, k_lo)

    dq = _dq_key_tiles(
        dq,
        q,
        do,
        lse,
        delta,
        K_source,
        V_source,
        tile_batch,
        k_lo,
        k_full,
        query_index,
        qk_scale,
        N_KEYS,
        K_TILE_SIZE,
        D_TILE,
        False,
        is_causal,
        EVEN_D,
        INPUT_PRECISION,
        USE_TMA,
    )
    dq = _dq_key_tiles(
        dq,
        q,
        do,
        lse,
        delta,
        K_source,
        V_source,
        tile_batch,
        k_masked,
        k_stop,
        query_index,
        qk_scale,
        N_KEYS,
        K_TILE_SIZE,
        D_TILE,
        True,
        is_causal,
        EVEN_D,
        INPUT_PRECISION,
        USE_TMA,
    )
    if SPLIT:
        cols = tl.arange(0, D_TILE)
        tl.atomic_add(
            dQ_ptr + batch_index * stride_dqb + query_index[:, None] * stride_dqq + cols[None, :] * stride_dqd,
            dq * scale,
            mask=in_range[:, None] & (cols[None, :] < D),
            sem="relaxed",
        )
        return

    dQ_block_ptr = tl.make_block_ptr(
        dQ_ptr + batch_index * stride_dqb,
        shape=(N_QUERIES, D),
        strides=(stride_dqq, stride_dqd),
        offsets=(q_start, 0),
        block_shape=(Q_TILE_SIZE, D_TILE),
        order=(1, 0),
    )
    tl.store(dQ_block_ptr, (dq * scale).to(dQ_ptr.dtype.element_ty), boundary_check=(0, 1))


@triton.jit
def flash_bwd_preprocess_kernel(
    O_ptr,
    dO_ptr,
    Delta_ptr,
    dQ_acc_ptr,
    stride_ob,
    stride_oq,
    stride_dob,
    stride_doq,
    stride_lb,
    stride_lq,
    N_QUERIES,
    D: tl.constexpr,
    ROWS: tl.constexpr,
):
    """D = rowsum(dO * O) for ROWS rows, and those rows of the fp32 dQ accumulator (contiguous
    (batch, N, D)) zeroed: what the fused backward (`kernels.gluon_backward`) needs before it runs.
    Rows have unit column stride; D is a power of two."""
    batch = tl.program_id(1).to(tl.int64)
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, D)
    in_range = rows < N_QUERIES
    o = tl.load(
        O_ptr + batch * stride_ob + rows[:, None] * stride_oq + cols[None, :], mask=in_range[:, None], other=0.0
    )
    do = tl.load(
        dO_ptr + batch * stride_dob + rows[:, None] * stride_doq + cols[None, :], mask=in_range[:, None], other=0.0
    )
    tl.store(
        Delta_ptr + batch * stride_lb + rows * stride_lq,
        tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1),
        mask=in_range,
    )
    tl.store(
        dQ_acc_ptr + (batch * N_QUERIES + rows[:, None]) * D + cols[None, :],
        tl.zeros((ROWS, D), tl.float32),
        mask=in_range[:, None],
    )


@triton.jit
def dq_from_planes_kernel(
    acc_ptr,
    dQ_ptr,
    stride_qb,
    stride_qn,
    N_QUERIES,
    COLS: tl.constexpr,
    PLANES: tl.constexpr,
    ROWS: tl.constexpr,
):
    """dQ[b, r, c COLS + j] = acc[b, c, r, j] in dQ's dtype, for ROWS rows r of batch b, every plane c and
    column j < COLS: the fp32 accumulator the d = 128 fused backward adds into, one plane per consumer
    warpgroup's columns (`kernels.gluon_backward_d128`), contiguous (batch, PLANES, N, COLS); dQ's rows have
    unit column stride and any row and batch strides."""
    batch = tl.program_id(1).to(tl.int64)
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, COLS)
    in_range = (rows < N_QUERIES)[:, None]
    for c in tl.static_range(PLANES):
        part = tl.load(
            acc_ptr + ((batch * PLANES + c) * N_QUERIES + rows[:, None]) * COLS + cols[None, :], mask=in_range
        )
        tl.store(
            dQ_ptr + batch * stride_qb + rows[:, None] * stride_qn + c * COLS + cols[None, :],
            part.to(dQ_ptr.dtype.element_ty),
            mask=in_range,
        )
