"""FlashAttention-2 backward kernels in Triton (Algorithm 2 of the handout, split in two passes).

With D = rowsum(dO * O) precomputed and L from the forward, each tile of P is recomputed:

    S = Q_i K^(j)T * scale,   P = exp(S - L_i),   dP = dO_i V^(j)T,   dS = P * (dP - D_i)
    dV^(j) += P^T dO_i,   dK^(j) += dS^T Q_i * scale,   dQ_i += dS K^(j) * scale

Algorithm 2 updates dQ_i from every key tile, which needs atomics. Here P is recomputed twice
instead: `flash_bwd_dkdv_kernel` (one program per key tile, looping over query tiles) owns
dK^(j), dV^(j), and `flash_bwd_dq_kernel` (one program per query tile, looping over key tiles)
owns dQ_i, so no two programs write the same tile. The key-tile program computes the
transposed tiles S^T = K^(j) Q_i^T directly, so P^T and dS^T come out as the products
dV += P^T dO and dK += dS^T Q take them, and no (K_TILE, Q_TILE) tile is ever transposed.

Masking: entries with a padded query or key (edge tiles) or, when causal, a key after the
query (query r sits at position r + N_KEYS - N_QUERIES) get P = 0; causal loops skip the tiles
where every entry is masked. Base-2 exponentials as in the forward kernel.
"""

from __future__ import annotations

import triton
import triton.language as tl

from cs336_systems.attention.flash_triton_forward import LOG2E


@triton.jit
def flash_bwd_dkdv_kernel(
    Q_ptr, K_ptr, V_ptr, dO_ptr, L_ptr, Delta_ptr,
    dK_ptr, dV_ptr,
    stride_qb, stride_qq, stride_qd,
    stride_kb, stride_kk, stride_kd,
    stride_vb, stride_vk, stride_vd,
    stride_dob, stride_doq, stride_dod,
    stride_lb, stride_lq,
    stride_dkb, stride_dkk, stride_dkd,
    stride_dvb, stride_dvk, stride_dvd,
    N_QUERIES, N_KEYS,
    scale: tl.constexpr,  # constexpr: a runtime float becomes fp64 under torch.compile, making S fp64
    D: tl.constexpr,
    D_TILE: tl.constexpr,
    Q_TILE_SIZE: tl.constexpr,
    K_TILE_SIZE: tl.constexpr,
    is_causal: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    key_tile_index = tl.program_id(0)
    batch_index = tl.program_id(1).to(tl.int64)
    k_start = key_tile_index * K_TILE_SIZE
    offset = N_KEYS - N_QUERIES  # position of query 0
    q_first = 0
    if is_causal:
        # The first query tile holding a query at or after this tile's first key.
        q_first = (tl.maximum(k_start - offset, 0) // Q_TILE_SIZE) * Q_TILE_SIZE

    K_block_ptr = tl.make_block_ptr(
        K_ptr + batch_index * stride_kb, shape=(N_KEYS, D), strides=(stride_kk, stride_kd),
        offsets=(k_start, 0), block_shape=(K_TILE_SIZE, D_TILE), order=(1, 0),
    )
    V_block_ptr = tl.make_block_ptr(
        V_ptr + batch_index * stride_vb, shape=(N_KEYS, D), strides=(stride_vk, stride_vd),
        offsets=(k_start, 0), block_shape=(K_TILE_SIZE, D_TILE), order=(1, 0),
    )
    Q_block_ptr = tl.make_block_ptr(
        Q_ptr + batch_index * stride_qb, shape=(N_QUERIES, D), strides=(stride_qq, stride_qd),
        offsets=(q_first, 0), block_shape=(Q_TILE_SIZE, D_TILE), order=(1, 0),
    )
    dO_block_ptr = tl.make_block_ptr(
        dO_ptr + batch_index * stride_dob, shape=(N_QUERIES, D), strides=(stride_doq, stride_dod),
        offsets=(q_first, 0), block_shape=(Q_TILE_SIZE, D_TILE), order=(1, 0),
    )
    L_block_ptr = tl.make_block_ptr(
        L_ptr + batch_index * stride_lb, shape=(N_QUERIES,), strides=(stride_lq,),
        offsets=(q_first,), block_shape=(Q_TILE_SIZE,), order=(0,),
    )
    Delta_block_ptr = tl.make_block_ptr(
        Delta_ptr + batch_index * stride_lb, shape=(N_QUERIES,), strides=(stride_lq,),
        offsets=(q_first,), block_shape=(Q_TILE_SIZE,), order=(0,),
    )

    k = tl.load(K_block_ptr, boundary_check=(0, 1), padding_option="zero")
    v = tl.load(V_block_ptr, boundary_check=(0, 1), padding_option="zero")
    dk = tl.zeros((K_TILE_SIZE, D_TILE), dtype=tl.float32)
    dv = tl.zeros((K_TILE_SIZE, D_TILE), dtype=tl.float32)
    qk_scale = scale * LOG2E
    key_pos = k_start + tl.arange(0, K_TILE_SIZE)

    for q_start in range(q_first, N_QUERIES, Q_TILE_SIZE):
        q = tl.load(Q_block_ptr, boundary_check=(0, 1), padding_option="zero")
        do = tl.load(dO_block_ptr, boundary_check=(0, 1), padding_option="zero")
        lse = tl.load(L_block_ptr, boundary_check=(0,), padding_option="zero")
        delta = tl.load(Delta_block_ptr, boundary_check=(0,), padding_option="zero")

        s_t = tl.dot(k, tl.trans(q), input_precision=INPUT_PRECISION) * qk_scale  # (K_TILE, Q_TILE)
        p_t = tl.math.exp2(s_t - lse[None, :] * LOG2E)
        query_index = q_start + tl.arange(0, Q_TILE_SIZE)
        keep = query_index[None, :] < N_QUERIES
        if is_causal:
            keep = keep & (key_pos[:, None] <= query_index[None, :] + offset)
        p_t = tl.where(keep, p_t, 0.0)

        dv = tl.dot(p_t.to(do.dtype), do, acc=dv, input_precision=INPUT_PRECISION)
        dp_t = tl.dot(v, tl.trans(do), input_precision=INPUT_PRECISION)
        ds_t = p_t * (dp_t - delta[None, :])
        dk = tl.dot(ds_t.to(q.dtype), q, acc=dk, input_precision=INPUT_PRECISION)

        Q_block_ptr = Q_block_ptr.advance((Q_TILE_SIZE, 0))
        dO_block_ptr = dO_block_ptr.advance((Q_TILE_SIZE, 0))
        L_block_ptr = L_block_ptr.advance((Q_TILE_SIZE,))
        Delta_block_ptr = Delta_block_ptr.advance((Q_TILE_SIZE,))

    dK_block_ptr = tl.make_block_ptr(
        dK_ptr + batch_index * stride_dkb, shape=(N_KEYS, D), strides=(stride_dkk, stride_dkd),
        offsets=(k_start, 0), block_shape=(K_TILE_SIZE, D_TILE), order=(1, 0),
    )
    dV_block_ptr = tl.make_block_ptr(
        dV_ptr + batch_index * stride_dvb, shape=(N_KEYS, D), strides=(stride_dvk, stride_dvd),
        offsets=(k_start, 0), block_shape=(K_TILE_SIZE, D_TILE), order=(1, 0),
    )
    tl.store(dK_block_ptr, (dk * scale).to(dK_ptr.dtype.element_ty), boundary_check=(0, 1))
    tl.store(dV_block_ptr, dv.to(dV_ptr.dtype.element_ty), boundary_check=(0, 1))


@triton.jit
def flash_bwd_dq_kernel(
    Q_ptr, K_ptr, V_ptr, dO_ptr, L_ptr, Delta_ptr,
    dQ_ptr,
    stride_qb, stride_qq, stride_qd,
    stride_kb, stride_kk, stride_kd,
    stride_vb, stride_vk, stride_vd,
    stride_dob, stride_doq, stride_dod,
    stride_lb, stride_lq,
    stride_dqb, stride_dqq, stride_dqd,
    N_QUERIES, N_KEYS,
    scale: tl.constexpr,  # constexpr: a runtime float becomes fp64 under torch.compile, making S fp64
    D: tl.constexpr,
    D_TILE: tl.constexpr,
    Q_TILE_SIZE: tl.constexpr,
    K_TILE_SIZE: tl.constexpr,
    is_causal: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    query_tile_index = tl.program_id(0)
    batch_index = tl.program_id(1).to(tl.int64)
    q_start = query_tile_index * Q_TILE_SIZE
    offset = N_KEYS - N_QUERIES

    Q_block_ptr = tl.make_block_ptr(
        Q_ptr + batch_index * stride_qb, shape=(N_QUERIES, D), strides=(stride_qq, stride_qd),
        offsets=(q_start, 0), block_shape=(Q_TILE_SIZE, D_TILE), order=(1, 0),
    )
    dO_block_ptr = tl.make_block_ptr(
        dO_ptr + batch_index * stride_dob, shape=(N_QUERIES, D), strides=(stride_doq, stride_dod),
        offsets=(q_start, 0), block_shape=(Q_TILE_SIZE, D_TILE), order=(1, 0),
    )
    L_block_ptr = tl.make_block_ptr(
        L_ptr + batch_index * stride_lb, shape=(N_QUERIES,), strides=(stride_lq,),
        offsets=(q_start,), block_shape=(Q_TILE_SIZE,), order=(0,),
    )
    Delta_block_ptr = tl.make_block_ptr(
        Delta_ptr + batch_index * stride_lb, shape=(N_QUERIES,), strides=(stride_lq,),
        offsets=(q_start,), block_shape=(Q_TILE_SIZE,), order=(0,),
    )
    K_block_ptr = tl.make_block_ptr(
        K_ptr + batch_index * stride_kb, shape=(N_KEYS, D), strides=(stride_kk, stride_kd),
        offsets=(0, 0), block_shape=(K_TILE_SIZE, D_TILE), order=(1, 0),
    )
    V_block_ptr = tl.make_block_ptr(
        V_ptr + batch_index * stride_vb, shape=(N_KEYS, D), strides=(stride_vk, stride_vd),
        offsets=(0, 0), block_shape=(K_TILE_SIZE, D_TILE), order=(1, 0),
    )

    q = tl.load(Q_block_ptr, boundary_check=(0, 1), padding_option="zero")
    do = tl.load(dO_block_ptr, boundary_check=(0, 1), padding_option="zero")
    lse = tl.load(L_block_ptr, boundary_check=(0,), padding_option="zero")
    delta = tl.load(Delta_block_ptr, boundary_check=(0,), padding_option="zero")
    dq = tl.zeros((Q_TILE_SIZE, D_TILE), dtype=tl.float32)
    qk_scale = scale * LOG2E
    query_pos = q_start + tl.arange(0, Q_TILE_SIZE) + offset

    k_stop = N_KEYS
    if is_causal:
        k_stop = tl.minimum(N_KEYS, q_start + Q_TILE_SIZE + offset)

    for k_start in range(0, k_stop, K_TILE_SIZE):
        k = tl.load(K_block_ptr, boundary_check=(0, 1), padding_option="zero")
        v = tl.load(V_block_ptr, boundary_check=(0, 1), padding_option="zero")

        s = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION) * qk_scale
        p = tl.math.exp2(s - lse[:, None] * LOG2E)
        key_pos = k_start + tl.arange(0, K_TILE_SIZE)
        keep = key_pos[None, :] < N_KEYS
        if is_causal:
            keep = keep & (key_pos[None, :] <= query_pos[:, None])
        p = tl.where(keep, p, 0.0)

        dp = tl.dot(do, tl.trans(v), input_precision=INPUT_PRECISION)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, acc=dq, input_precision=INPUT_PRECISION)

        K_block_ptr = K_block_ptr.advance((K_TILE_SIZE, 0))
        V_block_ptr = V_block_ptr.advance((K_TILE_SIZE, 0))

    dQ_block_ptr = tl.make_block_ptr(
        dQ_ptr + batch_index * stride_dqb, shape=(N_QUERIES, D), strides=(stride_dqq, stride_dqd),
        offsets=(q_start, 0), block_shape=(Q_TILE_SIZE, D_TILE), order=(1, 0),
    )
    tl.store(dQ_block_ptr, (dq * scale).to(dQ_ptr.dtype.element_ty), boundary_check=(0, 1))
