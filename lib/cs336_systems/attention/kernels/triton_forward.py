"""FlashAttention-2 forward kernel in Triton (Algorithm 1 of the handout).

One program computes one query tile Q_i (Q_TILE rows) of one batch element, in a single pass
over key tiles K^(j), V^(j) (K_TILE rows), keeping O_i, l_i, m_i on chip in fp32:

    S = Q_i K^(j)T * scale                 (+ -1e6 where the key is after the query, if causal)
    m_new = max(m, rowmax S);  P~ = exp(S - m_new);  alpha = exp(m - m_new)
    l = alpha l + rowsum P~;   O_i = diag(alpha) O_i + P~ V^(j);   m = m_new
    O_i /= l;   L_i = m + log l

Scores are kept in base 2: s2 = S log2(e), so exp(S - m) = exp2(s2 - m2) with log2(e) folded
into the scale (exp2 is the native instruction). L is written back in natural log.

The pass over key tiles is split in two loops: first the *full* tiles, which every query of the
tile sees entirely (no causal mask, no padded keys: no masking work at all), then the *masked*
tiles — the ones on the causal diagonal and the ragged last tile — with the mask and boundary
checks. Causal query r sees keys c <= r (upper-left aligned, as `scaled_dot_product_attention`
with is_causal=True; decoding against a cache, lower-right aligned, is not offered); key tiles
wholly after every query of the tile are never visited. The head dimension D is padded on chip
to D_TILE (a power of two >= 16, as tl.dot needs): zero columns change no score and are never
stored.
Causal programs take the query tiles from the last (the longest loops) to the first, so the
heaviest work starts first and the GPU's last wave is short.

Split keys (SPLIT_KV, where the grid alone would leave SMs idle: `heuristics.kv_split_chunk`):
a third grid dimension cuts each query tile's keys into chunks of KV_CHUNK keys, one program per
chunk, each folding its chunk into its own (O_s, l_s, m_s), O_s unnormalized. Each program
leaves its partial in the workspace; the last to finish (an atomic count of arrivals per query
tile says which) merges them all, as the loop merges key tiles:

    m = max_s m_s;   l = sum_s exp2(m_s - m) l_s;   O = sum_s exp2(m_s - m) O_s / l

and writes O and L; it also sets the count back to zero, so the next launch can reuse the
workspace without clearing it. A chunk never holds only masked keys for a row (the causal mask
adds a finite offset, not -inf, and ragged tiles keep at least one key), so every m_s is finite.
"""

from __future__ import annotations

import triton
import triton.language as tl

from cs336_systems.attention.kernels.triton_tiles import load_rows, row_source

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)
LN2: tl.constexpr = tl.constexpr(0.6931471805599453)
MASKED_SCORE_OFFSET: tl.constexpr = tl.constexpr(-1e6)


@triton.jit
def _forward_key_tiles(
    o_i,
    l_i,
    m_i,
    q,
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
    """Fold key tiles [k_lo, k_hi) into the running (O, l, m); masks only when MASKED."""
    for k_start in range(k_lo, k_hi, K_TILE_SIZE):
        k = load_rows(K_source, batch_index, k_start, K_TILE_SIZE, D_TILE, MASKED, EVEN_D, USE_TMA)
        v = load_rows(V_source, batch_index, k_start, K_TILE_SIZE, D_TILE, MASKED, EVEN_D, USE_TMA)
        s = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION)
        if MASKED:
            s = s * qk_scale
            key_pos = k_start + tl.arange(0, K_TILE_SIZE)
            if is_causal:
                s += tl.where(key_pos[None, :] > query_pos[:, None], MASKED_SCORE_OFFSET * LOG2E, 0.0)
            s = tl.where(key_pos[None, :] < N_KEYS, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            p = tl.math.exp2(s - m_new[:, None])
        else:
            # The scale is applied inside the exponent's fused multiply-add, not as a pass of its own.
            m_new = tl.maximum(m_i, tl.max(s, axis=1) * qk_scale)
            p = tl.math.exp2(s * qk_scale - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = alpha * l_i + tl.sum(p, axis=1)
        o_i = o_i * alpha[:, None]
        o_i = tl.dot(p.to(v.dtype), v, acc=o_i, input_precision=INPUT_PRECISION)
        m_i = m_new
    return o_i, l_i, m_i


@triton.jit
def flash_fwd_kernel(
    Q_ptr,
    K_ptr,
    V_ptr,
    O_ptr,
    L_ptr,
    Partial_ptr,
    Arrivals_ptr,  # SPLIT_KV only: fp32 partials, int32 arrival counts (zero between launches)
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
    stride_lb,
    stride_lq,
    N_QUERIES,
    N_KEYS,
    KV_CHUNK,  # SPLIT_KV only: keys per program, a multiple of K_TILE_SIZE
    scale: tl.constexpr,  # constexpr: a runtime float becomes fp64 under torch.compile, making S fp64
    D: tl.constexpr,
    D_TILE: tl.constexpr,
    Q_TILE_SIZE: tl.constexpr,
    K_TILE_SIZE: tl.constexpr,
    is_causal: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    USE_TMA: tl.constexpr,
    SPLIT_KV: tl.constexpr,
    MAX_SPLITS: tl.constexpr,  # SPLIT_KV only: the grid's chunks per query tile, rounded up to a power of two
):
    query_tile_index = tl.program_id(0)
    if is_causal:
        query_tile_index = tl.num_programs(0) - 1 - query_tile_index
    tile_batch = tl.program_id(1)
    batch_index = tile_batch.to(tl.int64)  # batch * stride can pass 2^31 elements
    q_start = query_tile_index * Q_TILE_SIZE
    EVEN_D: tl.constexpr = D == D_TILE

    Q_source = row_source(
        Q_ptr, tile_batch, stride_qb, stride_qq, stride_qd, N_QUERIES, D, Q_TILE_SIZE, D_TILE, USE_TMA
    )
    K_source = row_source(K_ptr, tile_batch, stride_kb, stride_kk, stride_kd, N_KEYS, D, K_TILE_SIZE, D_TILE, USE_TMA)
    V_source = row_source(V_ptr, tile_batch, stride_vb, stride_vk, stride_vd, N_KEYS, D, K_TILE_SIZE, D_TILE, USE_TMA)
    O_block_ptr = tl.make_block_ptr(
        O_ptr + batch_index * stride_ob,
        shape=(N_QUERIES, D),
        strides=(stride_oq, stride_od),
        offsets=(q_start, 0),
        block_shape=(Q_TILE_SIZE, D_TILE),
        order=(1, 0),
    )
    L_block_ptr = tl.make_block_ptr(
        L_ptr + batch_index * stride_lb,
        shape=(N_QUERIES,),
        strides=(stride_lq,),
        offsets=(q_start,),
        block_shape=(Q_TILE_SIZE,),
        order=(0,),
    )

    q = load_rows(Q_source, tile_batch, q_start, Q_TILE_SIZE, D_TILE, True, EVEN_D, USE_TMA)
    o_i = tl.zeros((Q_TILE_SIZE, D_TILE), dtype=tl.float32)
    l_i = tl.zeros((Q_TILE_SIZE,), dtype=tl.float32)
    m_i = tl.full((Q_TILE_SIZE,), float("-inf"), dtype=tl.float32)
    qk_scale = scale * LOG2E

    # Full key tiles end at k_full; masked ones run from there to k_stop.
    query_pos = q_start + tl.arange(0, Q_TILE_SIZE)
    k_full = (N_KEYS // K_TILE_SIZE) * K_TILE_SIZE
    k_stop = N_KEYS
    if is_causal:
        k_full = tl.minimum(k_full, ((q_start + 1) // K_TILE_SIZE) * K_TILE_SIZE)
        k_stop = tl.minimum(N_KEYS, q_start + Q_TILE_SIZE)

    k_lo = 0
    k_hi = k_stop
    if SPLIT_KV:
        split = tl.program_id(2)
        n_splits = tl.maximum(tl.cdiv(k_stop, KV_CHUNK), 1)
        if split >= n_splits:  # this query tile has fewer chunks than the grid's longest
            return
        k_lo = split * KV_CHUNK
        k_hi = tl.minimum(k_stop, k_lo + KV_CHUNK)

    o_i, l_i, m_i = _forward_key_tiles(
        o_i,
        l_i,
        m_i,
        q,
        K_source,
        V_source,
        tile_batch,
        k_lo,
        tl.minimum(k_full, k_hi),
        query_pos,
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
    o_i, l_i, m_i = _forward_key_tiles(
        o_i,
        l_i,
        m_i,
        q,
        K_source,
        V_source,
        tile_batch,
        tl.maximum(k_full, k_lo),
        k_hi,
        query_pos,
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

    if SPLIT_KV:
        if n_splits > 1:
            tile_slot = tile_batch * tl.num_programs(0) + query_tile_index
            SLOT: tl.constexpr = Q_TILE_SIZE * (D_TILE + 2)  # O_s, then m_s, then l_s
            slots = Partial_ptr + tile_slot.to(tl.int64) * tl.num_programs(2) * SLOT
            rows = tl.arange(0, Q_TILE_SIZE)
            o_offsets = rows[:, None] * D_TILE + tl.arange(0, D_TILE)[None, :]
            mine = slots + split * SLOT
            tl.store(mine + o_offsets, o_i)
            tl.store(mine + Q_TILE_SIZE * D_TILE + rows, m_i)
            tl.store(mine + Q_TILE_SIZE * (D_TILE + 1) + rows, l_i)
            tl.debug_barrier()  # every thread's partial stored before the release below publishes it
            arrivals = Arrivals_ptr + tile_slot
            if tl.atomic_add(arrivals, 1, sem="acq_rel", scope="gpu") < n_splits - 1:
                return  # a later chunk's program merges this partial
            # Merge every chunk's partial, this program's own included. The loads of a group of chunks are
            # independent of one another, so they wait out one L2 round trip together (merging one partial
            # after the other waited out one per chunk); a group of whole tiles is what the registers hold.
            # .cg: read from L2, where the other programs' stores landed, not from this SM's L1.
            m_i = tl.full((Q_TILE_SIZE,), float("-inf"), dtype=tl.float32)
            for any_chunk in tl.static_range(MAX_SPLITS):
                m_s = tl.load(
                    slots + any_chunk * SLOT + Q_TILE_SIZE * D_TILE + rows,
                    mask=any_chunk < n_splits,
                    other=float("-inf"),
                    cache_modifier=".cg",
                )
                m_i = tl.maximum(m_i, m_s)
            l_i = tl.zeros((Q_TILE_SIZE,), dtype=tl.float32)
            o_i = tl.zeros((Q_TILE_SIZE, D_TILE), dtype=tl.float32)
            MERGE_GROUP: tl.constexpr = 4 if D_TILE <= 64 else 2
            for first in range(0, n_splits, MERGE_GROUP):
                for member in tl.static_range(MERGE_GROUP):
                    theirs = slots + (first + member) * SLOT
                    present = first + member < n_splits
                    m_s = tl.load(
                        theirs + Q_TILE_SIZE * D_TILE + rows, mask=present, other=float("-inf"), cache_modifier=".cg"
                    )
                    l_s = tl.load(
                        theirs + Q_TILE_SIZE * (D_TILE + 1) + rows, mask=present, other=0.0, cache_modifier=".cg"
                    )
                    o_s = tl.load(theirs + o_offsets, mask=present, other=0.0, cache_modifier=".cg")
                    weight = tl.math.exp2(m_s - m_i)  # zero for absent chunks
                    l_i += weight * l_s
                    o_i += o_s * weight[:, None]
            tl.atomic_xchg(arrivals, 0, sem="relaxed", scope="gpu")

    o_i = o_i / l_i[:, None]
    lse = (m_i + tl.math.log2(l_i)) * LN2
    tl.store(O_block_ptr, o_i.to(O_ptr.dtype.element_ty), boundary_check=(0, 1))
    tl.store(L_block_ptr, lse, boundary_check=(0,))
