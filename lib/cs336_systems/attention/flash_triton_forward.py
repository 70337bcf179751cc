"""FlashAttention-2 forward kernel in Triton (Algorithm 1 of the handout).

One program computes one query tile Q_i (Q_TILE rows) of one batch element, in a single loop
over key tiles K^(j), V^(j) (K_TILE rows), keeping O_i, l_i, m_i on chip in fp32:

    S = Q_i K^(j)T * scale                 (+ -1e6 where the key is after the query, if causal)
    m_new = max(m, rowmax S);  P~ = exp(S - m_new);  alpha = exp(m - m_new)
    l = alpha l + rowsum P~;   O_i = diag(alpha) O_i + P~ V^(j);   m = m_new
    O_i /= l;   L_i = m + log l

Scores are kept in base 2: s2 = S log2(e), so exp(S - m) = exp2(s2 - m2) with log2(e) folded
into the scale once (exp2 is the native instruction). L is written back in natural log.

Edge tiles: block pointers load zeros outside (N, d) and stores are boundary-checked; keys past
N_KEYS get score -inf so they weigh nothing. The head dimension D is padded on chip to D_TILE
(a power of two >= 16, as tl.dot needs): zero columns change no score and are never stored.
With IS_CAUSAL, query r sits at position r + N_KEYS - N_QUERIES and the loop stops after the
last key tile that any query of the tile can see.
"""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)
LN2: tl.constexpr = tl.constexpr(0.6931471805599453)
MASKED_SCORE_OFFSET: tl.constexpr = tl.constexpr(-1e6)


@triton.jit
def flash_fwd_kernel(
    Q_ptr, K_ptr, V_ptr,
    O_ptr, L_ptr,
    stride_qb, stride_qq, stride_qd,
    stride_kb, stride_kk, stride_kd,
    stride_vb, stride_vk, stride_vd,
    stride_ob, stride_oq, stride_od,
    stride_lb, stride_lq,
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
    batch_index = tl.program_id(1).to(tl.int64)  # batch * stride can pass 2^31 elements
    q_start = query_tile_index * Q_TILE_SIZE

    Q_block_ptr = tl.make_block_ptr(
        Q_ptr + batch_index * stride_qb,
        shape=(N_QUERIES, D), strides=(stride_qq, stride_qd),
        offsets=(q_start, 0), block_shape=(Q_TILE_SIZE, D_TILE), order=(1, 0),
    )
    K_block_ptr = tl.make_block_ptr(
        K_ptr + batch_index * stride_kb,
        shape=(N_KEYS, D), strides=(stride_kk, stride_kd),
        offsets=(0, 0), block_shape=(K_TILE_SIZE, D_TILE), order=(1, 0),
    )
    V_block_ptr = tl.make_block_ptr(
        V_ptr + batch_index * stride_vb,
        shape=(N_KEYS, D), strides=(stride_vk, stride_vd),
        offsets=(0, 0), block_shape=(K_TILE_SIZE, D_TILE), order=(1, 0),
    )
    O_block_ptr = tl.make_block_ptr(
        O_ptr + batch_index * stride_ob,
        shape=(N_QUERIES, D), strides=(stride_oq, stride_od),
        offsets=(q_start, 0), block_shape=(Q_TILE_SIZE, D_TILE), order=(1, 0),
    )
    L_block_ptr = tl.make_block_ptr(
        L_ptr + batch_index * stride_lb,
        shape=(N_QUERIES,), strides=(stride_lq,),
        offsets=(q_start,), block_shape=(Q_TILE_SIZE,), order=(0,),
    )

    q = tl.load(Q_block_ptr, boundary_check=(0, 1), padding_option="zero")
    o_i = tl.zeros((Q_TILE_SIZE, D_TILE), dtype=tl.float32)
    l_i = tl.zeros((Q_TILE_SIZE,), dtype=tl.float32)
    m_i = tl.full((Q_TILE_SIZE,), float("-inf"), dtype=tl.float32)
    qk_scale = scale * LOG2E

    query_pos = q_start + tl.arange(0, Q_TILE_SIZE) + (N_KEYS - N_QUERIES)
    k_stop = N_KEYS
    if is_causal:
        k_stop = tl.minimum(N_KEYS, q_start + Q_TILE_SIZE + N_KEYS - N_QUERIES)

    for k_start in range(0, k_stop, K_TILE_SIZE):
        k = tl.load(K_block_ptr, boundary_check=(0, 1), padding_option="zero")
        v = tl.load(V_block_ptr, boundary_check=(0, 1), padding_option="zero")
        s = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION) * qk_scale
        key_pos = k_start + tl.arange(0, K_TILE_SIZE)
        if is_causal:
            s += tl.where(key_pos[None, :] > query_pos[:, None], MASKED_SCORE_OFFSET * LOG2E, 0.0)
        s = tl.where(key_pos[None, :] < N_KEYS, s, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = alpha * l_i + tl.sum(p, axis=1)
        o_i = o_i * alpha[:, None]
        o_i = tl.dot(p.to(v.dtype), v, acc=o_i, input_precision=INPUT_PRECISION)
        m_i = m_new

        K_block_ptr = K_block_ptr.advance((K_TILE_SIZE, 0))
        V_block_ptr = V_block_ptr.advance((K_TILE_SIZE, 0))

    o_i = o_i / l_i[:, None]
    lse = (m_i + tl.math.log2(l_i)) * LN2
    tl.store(O_block_ptr, o_i.to(O_ptr.dtype.element_ty), boundary_check=(0, 1))
    tl.store(L_block_ptr, lse, boundary_check=(0,))
