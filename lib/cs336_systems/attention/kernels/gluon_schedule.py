"""The order in which the Gluon attention kernels' CTAs take their blocks: heaviest first, in sections of
heads whose shared tensors stay in L2 together (the idea of FlashAttention-3's longest-processing-time tile
scheduler, `SingleTileLPTScheduler`).

A kernel's grid holds n_blocks · n_batch CTAs. The GPU hands CTAs to SMs in launch order as
SMs come free, so the order is a list schedule, and longest items first keeps its makespan close to the
least (Graham's LPT rule). Under the causal mask a CTA's work depends on its block: the forward's query
block i visits i + 1 key tiles, the backward's key block j the query tiles from j's on. Launched as a
(block, batch) grid, one head after another, each head's heaviest block started first but the last
heads' heaviest ones started in the last waves and ran alone. All heads' heaviest blocks first would
spread the running CTAs over every head, whose shared tensors (K and V for the forward, Q and dO for the
backward) would no longer stay in L2 together. So the heads go in sections of SECTION (a power of two,
`heuristics.heads_per_section`), and within a section the blocks go heaviest first, the section's heads
innermost, CTA `pid` of a one-dimensional grid taking

    section s = pid // (n_blocks SECTION),  heads in it h_s = min(SECTION, n_batch - s SECTION)
    r = pid - s n_blocks SECTION:  rank = r // h_s  (0: the heaviest block),  batch = s SECTION + r mod h_s

The last section holds the remaining heads when SECTION does not divide n_batch. SECTION = 1 is the
(block, batch) grid's order, and launches as that grid (`block_and_batch`): where the order does not change,
neither does the launch geometry the kernels were measured with.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.jit
def heaviest_first(pid, n_blocks, n_batch, SECTION: gl.constexpr):
    """(rank, batch) of the CTA `pid` of a grid of n_blocks · n_batch (module docstring): rank 0 is the
    heaviest block, which the caller maps to its block index. Integer arithmetic only, so that its Python
    body runs on the CPU too (tests/test_flash_gluon_schedule.py)."""
    per_section = n_blocks * SECTION
    section = pid // per_section
    first = section * SECTION
    heads = n_batch - first  # the last section's, which may hold fewer than SECTION
    if heads > SECTION:
        heads = SECTION
    r = pid - section * per_section
    return r // heads, first + r % heads


@gluon.jit
def block_and_batch(N_ROWS, BLOCK_ROWS: gl.constexpr, SECTION: gl.constexpr):
    """(rank, batch, n_blocks) of this CTA, for blocks of BLOCK_ROWS of N_ROWS rows: a (n_blocks, n_batch)
    grid's own coordinates for SECTION = 1, else `heaviest_first` of a one-dimensional grid of
    n_blocks · n_batch (`launch.gluon.schedule_grid`)."""
    if SECTION == 1:
        n_blocks = gl.num_programs(0)
        rank = gl.program_id(0)
        batch = gl.program_id(1)
    else:
        n_blocks = gl.cdiv(N_ROWS, BLOCK_ROWS)
        rank, batch = heaviest_first(gl.program_id(0), n_blocks, gl.num_programs(0) // n_blocks, SECTION)
    return rank, batch, n_blocks
