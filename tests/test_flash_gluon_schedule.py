"""The Gluon kernels' CTA order (`flash_gluon_schedule.heaviest_first`, replayed by its Python body on the CPU)
and the launches' choice of heads per section (`heuristics.heads_per_section`)."""

from __future__ import annotations

import pytest

from cs336_systems.attention.heuristics import heads_per_section
from cs336_systems.attention.kernels.gluon_schedule import heaviest_first
from cs336_systems.attention.launch.gluon import schedule_grid

order_of = heaviest_first.fn  # the @gluon.jit function's Python body: integer arithmetic only


def expected_order(n_blocks: int, n_batch: int, section: int) -> list[tuple[int, int]]:
    """Sections of `section` heads one after another (the last holding what remains); within one, the blocks
    by rank, heaviest (0) first, and for each rank the section's heads in turn."""
    return [
        (rank, head)
        for first in range(0, n_batch, section)
        for rank in range(n_blocks)
        for head in range(first, min(n_batch, first + section))
    ]


@pytest.mark.parametrize(
    "n_blocks, n_batch, section",
    [(32, 64, 16), (16, 4, 4), (7, 5, 2), (3, 10, 4), (5, 3, 4), (9, 1, 1), (4, 6, 1), (1, 7, 8)],
)
def test_heaviest_first_visits_each_block_once_heaviest_first_per_section(n_blocks, n_batch, section):
    got = [order_of(pid, n_blocks, n_batch, section) for pid in range(n_blocks * n_batch)]
    assert got == expected_order(n_blocks, n_batch, section)
    assert sorted(got) == [(rank, head) for rank in range(n_blocks) for head in range(n_batch)]


def test_one_head_per_section_is_the_block_batch_grid_order():
    """SECTION = 1 launches as the (block, batch) grids did: blocks innermost, one head after another."""
    n_blocks, n_batch = 6, 3
    assert [order_of(pid, n_blocks, n_batch, 1) for pid in range(n_blocks * n_batch)] == [
        (block, batch) for batch in range(n_batch) for block in range(n_blocks)
    ]


def test_one_head_per_section_keeps_the_block_batch_grid():
    """Where the order is the old one, so is the launch geometry; sections launch one dimension."""
    assert schedule_grid(33, 4, 1) == (33, 4)
    assert schedule_grid(33, 4, 2) == (132,)


@pytest.mark.parametrize(
    "n, d, batch, section",
    [
        (4096, 128, 64, 4),  # a head's K and V are 2 MiB: 4 fit in 8 MiB
        (8192, 96, 64, 2),  # 3 MiB: 2.7 fit, a power of two
        (8192, 128, 16, 2),  # 4 MiB, 64 blocks of 128 rows
        (16384, 64, 16, 1),  # 128 blocks: one head after another (the 2025 leaderboard's shape)
        (32768, 128, 32, 1),  # the 2026 shape's: 16 MiB, and 256 blocks
        (4096, 64, 3, 4),  # at most the power of two from the batch on
        (4096, 64, 1, 1),
    ],
)
def test_heads_per_section_fit_in_section_bytes(monkeypatch, n, d, batch, section):
    from cs336_systems.attention import heuristics

    monkeypatch.setattr(heuristics, "SECTION_BYTES", 8 << 20)
    monkeypatch.setattr(heuristics, "SECTION_MAX_BLOCKS", 64)
    assert heads_per_section(n, d, 2, batch, 128, True) == section
    assert heads_per_section(n, d, 2, batch, 128, False) == 1  # without the mask: one head after another


@pytest.mark.gpu
@pytest.mark.parametrize("d, is_causal", [(64, True), (128, True), (128, False)])
def test_every_order_computes_the_same_gradients_on_gpu(d, is_causal):
    """The forward and fused backward kernels launched in sections of 1, 4 (six heads: one full section and a
    residual of two) and the launch's own choice: O, L, dK and dV bit for bit the same (each is one CTA's),
    dQ to fp32 rounding (its parts are added in another order), at a ragged N."""
    import torch

    from cs336_systems.attention import heuristics
    from cs336_systems.attention.launch import gluon as flash_gluon

    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Gluon kernels run on Hopper")
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(6, 1000, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4))
    found = {}
    for section in (1, 4, None):
        # NaN where a kernel writes: a block that no CTA took stays NaN
        out, lse = torch.full_like(q, float("nan")), torch.full(q.shape[:-1], float("nan"), device="cuda")
        delta, dq_acc = torch.empty_like(lse), torch.empty(q.shape, device="cuda")
        grad_k, grad_v = torch.full_like(k, float("nan")), torch.full_like(v, float("nan"))
        sections = heuristics.gluon_sections(1000, d, 2, 6, is_causal)
        launches = [
            flash_gluon.forward_launch(q, k, v, out, lse, is_causal, sections[0]),
            flash_gluon.preprocess_launch(out, do, delta, dq_acc),
            flash_gluon.backward_launch(q, k, v, do, lse, delta, grad_k, grad_v, dq_acc, is_causal, sections[1]),
        ]
        for launch in launches:
            if section is not None and "SECTION" in launch.options:
                launch = flash_gluon.with_section(launch, section, 6)
            launch.run()
        found[section] = (out, lse, grad_k, grad_v, dq_acc)
    assert heuristics.heads_per_section(1000, d, 2, 6, 128, is_causal) == (8 if is_causal else 1)  # the launch's
    for section in (4, None):
        for name, x, y in zip(("O", "L", "dK", "dV"), found[1], found[section]):
            assert torch.equal(x, y), (section, name)
        torch.testing.assert_close(found[section][-1], found[1][-1], rtol=1e-5, atol=1e-5)
    for section in (1, 4, None):
        assert all(torch.isfinite(t).all() for t in found[section]), section


def test_with_section_reorders_a_launch_of_either_grid():
    from cs336_systems.attention.launch.gluon import KernelLaunch, with_section

    launch = KernelLaunch(kernel=None, grid=(33, 4), args=(), options={"SECTION": 1, "STAGES": 2})
    sections = with_section(launch, 2, 4)
    assert sections.grid == (132,) and sections.options == {"SECTION": 2, "STAGES": 2}
    assert with_section(sections, 1, 4).grid == (33, 4)
