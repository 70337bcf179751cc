"""Every threshold and route rule of FlashAttention, each with its reason; the numbers behind them are in
docs/flash_attention_tuning.md (the version each rule came from is named there).

Pure functions of a problem's numbers (head dimension, lengths, batch·heads, dtype, the device's compute
capability and SM count). `choose` applies all of them to one problem at once, after the tuned table has
given each kernel its configuration (`configs.kernel_configs`): which kernels serve the call, how a small
grid splits and in which order the Gluon kernels' CTAs run (`Choices`). The launch layer adds the tensors'
own facts (`launch.dispatch`) and builds the launches from the choices (`launch.plans`, `launch.gluon`)
without asking again. Tests lift a threshold by patching it here.

Three kinds of rule:

1. **Gluon or Triton.** The Gluon kernels for Hopper (`kernels.gluon_*`) use `warpgroup_mma`, Hopper's
   instruction, and TMA descriptors; they serve 16-bit inputs at the two head dimensions they were measured
   at, N_q = N_k, on compute capability 9. A forward CTA holds 2 · 64 query rows, twice a Triton program's,
   so it needs twice the batch (or sequence) to fill the SMs: the forward runs from a sequence length on
   (`MIN_SEQ_LEN`) and, below `ANY_GRID_SEQ_LEN`, with enough work (`MIN_CTAS_PER_SM` at d = 64,
   `MIN_BATCH` at d = 128, where the Triton kernel's split-key grids were faster at one or two heads). The
   fused backward at d = 64 serves causal attention only, where it beat the two Triton kernels (without
   the mask it did not); at d = 128 causal and full attention from `D128_BWD_MIN_SEQ_LEN` on, and at
   shorter sequences from about one CTA per SM (`D128_BWD_MIN_CTAS_PER_SM`), below which the Triton
   kernels were faster.
2. **Small grids.** A launch whose grid has fewer programs than the GPU has SMs (`is_small_grid`) is
   latency-bound: one program's loop is the kernel's time, and the tiles that fill the GPU best lose. There
   the forward splits each query tile's keys over programs (`kv_split_chunk`), and the fp32 backward splits
   each kernel's loop (`backward_split`).
3. **CTA order.** Under the causal mask the Gluon kernels' CTAs go heaviest first, in sections of heads
   whose shared tensors fit in L2 (`heads_per_section`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from cs336_systems.attention.validation import Problem, head_dim_tile

# ---------------------------------------------------------------------------- the Gluon kernels' configurations
# Per head dimension: (Q_TILE per consumer warpgroup, K_TILE, STAGES) of the forward, the best of a sweep.
GLUON_TILES = {64: (64, 128, 3), 128: (64, 128, 2)}
# Per head dimension: (Q_TILE, K_HALF key rows per consumer warpgroup, STAGES) of the fused backward. 64-row
# tiles are what the registers allow; at d = 64 two stages and the 232/40 register split were the best of
# those tried; d = 128 has shared memory for three stages since P stays in registers, and two measured faster.
GLUON_BWD_TILES = {64: (64, 64, 2), 128: (64, 64, 2)}
CONSUMER_REGS, PRODUCER_REGS = 232, 40
# Per head dimension of the backward, (consumer, producer) registers: d = 128's dK, dV, S and dP alone
# take 192 of a consumer thread's registers (kernels.gluon_backward_d128).
GLUON_BWD_REGS = {64: (CONSUMER_REGS, PRODUCER_REGS), 128: (240, 24)}

# ---------------------------------------------------------------------------- Gluon or Triton (rule 1)
GLUON_DTYPES = (torch.bfloat16, torch.float16)
# Where the fused backward beat the two Triton kernels: causal only at d = 64, both at d = 128.
GLUON_BWD_CAUSALITY = {64: (True,), 128: (True, False)}
# The forward, per head dimension: from this sequence length on ...
MIN_SEQ_LEN = {64: 16384, 128: 4096}
# ... and below ANY_GRID_SEQ_LEN only with this many CTAs per SM and this batch·heads (then per causality):
# at d = 128 the Triton kernel's split-key grids were faster at one head, and at two heads with the mask.
MIN_CTAS_PER_SM = {64: 3, 128: 0}
MIN_BATCH = {64: {True: 1, False: 1}, 128: {True: 4, False: 2}}
# From here on at any grid: at one and four heads the Gluon kernel was faster than the Triton kernel there.
ANY_GRID_SEQ_LEN = {128: 16384}
# d = 128's fused backward: at any grid from this length on, shorter from this many CTAs per SM on (between
# the CTA counts where the Triton kernels were faster and those where the fused kernel was, on 132 SMs).
D128_BWD_MIN_SEQ_LEN = 16384
D128_BWD_MIN_CTAS_PER_SM = 0.75


def gluon_forward_eligible(
    d: int, n_q: int, n_k: int, dtype: torch.dtype, batch: int, capability_major: int, sm_count: int, is_causal: bool
) -> bool:
    """Whether the Gluon forward serves this problem (rule 1), before the tensors' own facts (TMA-readable
    rows, no tiles override, not interpreted: `launch.dispatch.rule_choices`)."""
    if dtype not in GLUON_DTYPES or d not in GLUON_TILES or n_q != n_k or capability_major != 9:
        return False
    if n_q < MIN_SEQ_LEN[d]:
        return False
    if d in ANY_GRID_SEQ_LEN and n_q >= ANY_GRID_SEQ_LEN[d]:
        return True
    ctas = -(-n_q // (2 * GLUON_TILES[d][0])) * batch
    return batch >= MIN_BATCH[d][bool(is_causal)] and ctas >= MIN_CTAS_PER_SM[d] * sm_count


def in_backward_scope(d: int, is_causal: bool) -> bool:
    """Whether a fused Gluon backward exists for this head dimension and causality (`GLUON_BWD_CAUSALITY`)."""
    return bool(is_causal) in GLUON_BWD_CAUSALITY.get(d, ())


def gluon_backward_eligible(
    d: int, n_q: int, n_k: int, dtype: torch.dtype, batch: int, capability_major: int, sm_count: int, is_causal: bool
) -> bool:
    """Whether the fused Gluon backward serves this problem (rule 1): causal at d = 64 within the forward's
    limits; at d = 128, causal or not, from D128_BWD_MIN_SEQ_LEN or D128_BWD_MIN_CTAS_PER_SM CTAs per SM on."""
    if not in_backward_scope(d, is_causal):
        return False
    if d != 128:
        return gluon_forward_eligible(d, n_q, n_k, dtype, batch, capability_major, sm_count, is_causal)
    if dtype not in GLUON_DTYPES or n_q != n_k or capability_major != 9:
        return False
    ctas = -(-n_q // (2 * GLUON_BWD_TILES[d][1])) * batch
    return n_q >= D128_BWD_MIN_SEQ_LEN or ctas >= D128_BWD_MIN_CTAS_PER_SM * sm_count


# ---------------------------------------------------------------------------- small grids (rule 2)
# The query (dK/dV: key) tile size at which `is_small_grid` counts a kernel's programs.
SMALL_GRID_TILE = 64
# Fewest key tiles per program when the forward splits keys (`kv_split_chunk`), and fewest loop tiles per
# chunk when a backward kernel splits its loop (`backward_split`).
MIN_SPLIT_TILES = 2


def is_small_grid(kernel: str, batch: int, n_q: int, n_k: int, sm_count: int) -> bool:
    """Whether `kernel`'s grid at 64-row tiles, batch·ceil(N / 64) programs (N of the queries; of the
    keys for dK/dV), is smaller than the GPU's `sm_count` SMs: a launch whose latency is one program's
    loop, where the configuration that fills the GPU best is not the fastest; the tuned table keeps such
    problems apart."""
    rows = n_k if kernel == "dkdv" else n_q
    return batch * ((rows + SMALL_GRID_TILE - 1) // SMALL_GRID_TILE) < sm_count


def split_programs_per_sm(head_dim_tile: int) -> float:
    """Programs per SM that a split-key forward aims for: the fastest chunks held about W / (SMs · p) key
    tiles, with p = 4/3 where two programs fit in an SM's shared memory (D_TILE <= 64) and p = 2/3 where
    one does (D_TILE = 128: 3 stages of 128x128 K and V tiles); `docs/flash_small_grid_h100.csv` has the
    tuner's runs."""
    return 4 / 3 if head_dim_tile <= 64 else 2 / 3


def kv_split_chunk(
    batch: int, n_q: int, n_k: int, is_causal: bool, q_tile: int, k_tile: int, head_dim_tile: int, sm_count: int
) -> int | None:
    """Keys per program where the forward kernel splits each query tile's keys over programs
    (`kernels.triton_forward`, SPLIT_KV), None where it does not split.

    A grid of batch·ceil(N_q / q_tile) programs smaller than the GPU's `sm_count` SMs leaves SMs
    idle while the longest program (under the causal mask the last query tile's, its
    min(N_k, ceil(N_q / q_tile)·q_tile) keys) is the latency. Chunks of C key tiles make that latency
    C tiles plus one merge of the chunks' partials, and the programs many: C is the work W (key tiles
    over all programs) spread over `split_programs_per_sm` programs per SM, at least MIN_SPLIT_TILES.
    No split where the longest program would keep half its tiles or more: there the merge and the
    extra programs' start cost as much as the split saves."""
    n_q_tiles = -(-n_q // q_tile)
    if batch * n_q_tiles >= sm_count:
        return None
    if is_causal:  # query tile i stops at key (i + 1)·q_tile (its last query sees keys j <= (i + 1)·q_tile - 1)
        tiles = [-(-min(n_k, (i + 1) * q_tile) // k_tile) for i in range(n_q_tiles)]
    else:
        tiles = [-(-n_k // k_tile)] * n_q_tiles
    work = batch * sum(tiles)
    chunk = max(MIN_SPLIT_TILES, math.ceil(work / (sm_count * split_programs_per_sm(head_dim_tile))))
    return chunk * k_tile if max(tiles) > 2 * chunk else None


def backward_split(
    kernel: str, batch: int, n_q: int, n_k: int, loop_tile: int, grid_tile: int, sm_count: int
) -> tuple[int, int]:
    """(rows per chunk, chunks) where a small grid's fp32 backward kernel splits its loop over programs
    (`kernels.triton_backward`, SPLIT), (0, 1) where it does not: the dK/dV kernel splits each key tile's
    query tiles (`loop_tile` = Q_TILE, `grid_tile` = K_TILE), the dQ kernel each query tile's key tiles.

    As in the forward (`kv_split_chunk`), one program per SM-less tile leaves SMs idle while the longest
    loop is the latency: the chunks multiply the programs up to about one per SM, each loop keeping at
    least MIN_SPLIT_TILES tiles. The partial results add into zeroed fp32 gradients by atomics, hence
    fp32 only (a 16-bit gradient would need an fp32 buffer and a conversion, two more launches; the
    16-bit small grids measured fast enough without). Unsplit, such a backward's time grew as N, the
    loop, not N², the work, and lost to the materialised attention."""
    rows_of_grid, rows_of_loop = (n_k, n_q) if kernel == "dkdv" else (n_q, n_k)
    programs = batch * -(-rows_of_grid // grid_tile)
    tiles = -(-rows_of_loop // loop_tile)
    splits = min(sm_count // max(programs, 1), tiles // MIN_SPLIT_TILES)
    if splits <= 1:
        return 0, 1
    chunk_tiles = -(-tiles // splits)
    return chunk_tiles * loop_tile, -(-tiles // chunk_tiles)


# ---------------------------------------------------------------------------- CTA order (rule 3)
# The causal kernels' CTAs go heaviest first in sections of heads whose two shared tensors fit in
# SECTION_BYTES, where a head has at most SECTION_MAX_BLOCKS blocks: a section's tensors then stay in L2
# while its CTAs run. With more blocks per head sections gained nothing or lost, and sections sized to
# the whole L2 (as FlashAttention-3 sizes them) lost at many heads.
SECTION_BYTES = 8 << 20
SECTION_MAX_BLOCKS = 64


def heads_per_section(n: int, d: int, element_size: int, batch: int, block_rows: int, is_causal: bool) -> int:
    """SECTION of `kernels.gluon_schedule` for a kernel whose CTAs take `block_rows` rows of a head each: under
    the causal mask, where a head has at most SECTION_MAX_BLOCKS blocks, the most heads, a power of two, whose
    two (N, d) tensors that all of a head's CTAs read (K and V in the forward, Q and dO in the backward) fit in
    SECTION_BYTES together; at least 1 and at most the power of two from `batch` on (larger ones order the CTAs
    alike, and each value compiles its own kernel). Otherwise one head after another: without the mask every
    CTA has the same work, and with more blocks per head a head's last blocks are short beside the whole."""
    if not is_causal or -(-n // block_rows) > SECTION_MAX_BLOCKS:
        return 1
    fit = max(1, SECTION_BYTES // (2 * n * d * element_size))
    return min(1 << (fit.bit_length() - 1), 1 << (max(batch, 1) - 1).bit_length())


def gluon_sections(n: int, d: int, element_size: int, batch: int, is_causal: bool) -> tuple[int, int]:
    """`heads_per_section` of the Gluon forward (CTAs of 2 · Q_TILE query rows) and of the fused backward (CTAs
    of 2 · K_HALF key rows) at the shipped tiles, for d in GLUON_TILES."""
    return (
        heads_per_section(n, d, element_size, batch, 2 * GLUON_TILES[d][0], is_causal),
        heads_per_section(n, d, element_size, batch, 2 * GLUON_BWD_TILES[d][1], is_causal),
    )


# ---------------------------------------------------------------------------- all rules for one problem
class Choices(NamedTuple):
    """What the rules choose for one problem (`choose`). A Gluon kernel is chosen only where the tensors
    allow it too (`choose`'s `gluon_readable`)."""

    gluon_forward: bool
    gluon_backward: bool
    forward_section: int  # heads per section of the Gluon forward's CTAs (rule 3)
    backward_section: int  # ... of the fused Gluon backward's
    kv_chunk: int  # keys per program of the split Triton forward, 0: no split (rule 2)
    forward_by_tma: bool  # whether the Triton forward may read through descriptors: not on a small grid (rule 2)
    dq_split: tuple[int, int]  # (rows per chunk, chunks) of the dQ kernel's loop, (0, 1): no split (rule 2)
    dkdv_split: tuple[int, int]  # ... of the dK/dV kernel's


def choose(problem: Problem, configs, capability_major: int, sm_count: int, gluon_readable: bool) -> Choices:
    """Every rule applied to `problem`, whose Triton kernels run `configs` (`configs.KernelConfigs`), on a
    device of this compute capability and SM count. `gluon_readable`: whether the Gluon kernels may serve the
    call at all (compiled kernels on a CUDA device, rows their descriptors read in place, no tiles override)."""
    n_q, n_k, d, batch, dtype, _, is_causal = problem
    facts = (d, n_q, n_k, dtype, batch, capability_major, sm_count, is_causal)
    gluon_forward = gluon_readable and gluon_forward_eligible(*facts)
    gluon_backward = gluon_readable and gluon_backward_eligible(*facts)
    forward_section, backward_section = (
        gluon_sections(n_q, d, dtype.itemsize, batch, is_causal) if gluon_forward or gluon_backward else (1, 1)
    )
    forward, dq, dkdv = configs
    kv_chunk = kv_split_chunk(batch, n_q, n_k, is_causal, forward.q_tile, forward.k_tile, head_dim_tile(d), sm_count)
    splits = []
    for kernel, config in (("dq", dq), ("dkdv", dkdv)):
        loop_tile, grid_tile = (config.q_tile, config.k_tile) if kernel == "dkdv" else (config.k_tile, config.q_tile)
        split = dtype == torch.float32 and is_small_grid(kernel, batch, n_q, n_k, sm_count)
        splits.append(backward_split(kernel, batch, n_q, n_k, loop_tile, grid_tile, sm_count) if split else (0, 1))
    return Choices(
        gluon_forward,
        gluon_backward,
        forward_section,
        backward_section,
        kv_chunk or 0,
        not is_small_grid("forward", batch, n_q, n_k, sm_count),
        *splits,
    )
