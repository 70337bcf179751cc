"""The fused Gluon backwards' handshakes between their two consumer warpgroups, on the CPU (d = 64's
owner-alternating protocol first, then d = 128's column halves at the end of the file).

The kernel (`flash_gluon_backward`) runs only on Hopper, and a wrong mbarrier phase there is a hang or a
silently wrong dQ. Here each warpgroup's sequence of waits, arrivals, dS^T stores and dQ products is replayed
as the kernel's `_query_tiles` and `_consumer` issue them, with the kernel's own phase arithmetic
(`_paired_before`), against a model of an mbarrier (a wait on parity p passes once the phase of parity p has
completed), under random interleavings of the two warpgroups. It checks that no interleaving deadlocks,
that every wait passes only once the completion it stands for has happened (not one two phases earlier, which
parity alone cannot tell apart), that no dS^T buffer is overwritten before the owner's product has read it,
that K is not overwritten before the other warpgroup's last product has read it, and that every (query tile,
key half) pair a warpgroup sees contributes exactly one dQ part. The Q/dO slot ring is the producer's
protocol, unchanged from the kernel's first version and left out.
"""

from __future__ import annotations

import random
import sys

import pytest

from cs336_systems.attention.kernels.gluon_backward import _paired_before

paired_before = _paired_before.fn  # the @gluon.jit function's Python body: integer arithmetic only


class Barrier:
    def __init__(self, count: int):
        self.count, self.arrivals, self.completed = count, 0, 0

    def arrive(self) -> None:
        self.arrivals += 1
        if self.arrivals == self.count:
            self.completed, self.arrivals = self.completed + 1, 0

    def passes(self, parity: int) -> bool:
        return (self.completed & 1) != parity


def tile_bounds(n: int, k_start: int, q_tile: int, k_half: int) -> tuple[int, list[int], int]:
    """n_tiles, each warpgroup's first tile and t_both, as `flash_bwd_gluon_kernel` and `_consumer` compute them."""
    q_lo = (k_start // q_tile) * q_tile
    n_tiles = -(-(n - q_lo) // q_tile)
    t_first = [min((k_start + h * k_half - q_lo) // q_tile, n_tiles) for h in (0, 1)]
    t_both = min((k_start + k_half - q_lo) // q_tile, n_tiles)
    return n_tiles, t_first, t_both


def warpgroup(h: int, n_tiles: int, t_first: int, t_both: int):
    """The operations warpgroup h issues, in its program order."""
    for t in range(t_first, n_tiles):
        b, paired = t % 2, t >= t_both
        if paired and b != h:
            c = paired_before(t, b, t_both)
            yield "wait", ("ds_free", b), (c - 1) & 1, c
        yield "store_ds", h, b, t
        if paired:
            yield "arrive", ("ds_ready", b)
        if t - 1 >= t_both and b != h:
            pb = 1 - b
            c = paired_before(t - 1, pb, t_both)
            yield "wait", ("ds_ready", pb), c & 1, c + 1
            yield "dq_pair", pb, t - 1
            yield "arrive", ("ds_free", pb)
        if not paired:
            yield "dq_solo", h, b, t
    t = n_tiles - 1
    if t >= t_both and t % 2 == h:  # the last tile's part, issued in `_consumer`
        c = paired_before(t, t % 2, t_both)
        yield "wait", ("ds_ready", t % 2), c & 1, c + 1
        yield "dq_pair", t % 2, t
        yield "arrive", ("ds_free", t % 2)
    other = 1 - h
    c = paired_before(n_tiles, other, t_both)
    yield "wait", ("ds_free", other), (c - 1) & 1, c
    yield "store_k", h


def run_cta(n: int, k_start: int, q_tile: int, k_half: int, rng: random.Random) -> None:
    n_tiles, t_first, t_both = tile_bounds(n, k_start, q_tile, k_half)
    bars = {("ds_ready", b): Barrier(2) for b in (0, 1)} | {("ds_free", b): Barrier(1) for b in (0, 1)}
    held = {}  # (half, parity) -> [tile, an owner's product still has to read it]
    parts: dict[tuple[int, int], int] = {}
    read_pairs: set[int] = set()
    programs = {h: warpgroup(h, n_tiles, t_first[h], t_both) for h in (0, 1)}
    pending = {h: next(programs[h], None) for h in (0, 1)}
    where = f"N = {n}, key block at {k_start}, tiles {q_tile}x{k_half}"
    while any(op is not None for op in pending.values()):
        runnable = [h for h, op in pending.items() if op is not None and (op[0] != "wait" or bars[op[1]].passes(op[2]))]
        assert runnable, f"deadlock at {where}: {pending}"
        h = rng.choice(runnable)
        op = pending[h]
        kind = op[0]
        if kind == "wait":
            _, bar, _, needed = op
            assert bars[bar].completed >= needed, f"{where}: warpgroup {h} passed {bar} before completion {needed}"
        elif kind == "arrive":
            bars[op[1]].arrive()
        elif kind == "store_ds":
            _, half, b, t = op
            assert not held.get((half, b), (None, False))[1], f"{where}: dS^T buffer {(half, b)} overwritten unread"
            held[(half, b)] = [t, t >= t_both]
        elif kind == "dq_pair":
            _, b, t = op
            for half in (0, 1):
                assert held.get((half, b), [None])[0] == t, f"{where}: tile {t}'s product read buffer {(half, b)}"
                held[(half, b)][1] = False
                parts[(t, half)] = parts.get((t, half), 0) + 1
            read_pairs.add(t)
        elif kind == "dq_solo":
            _, half, b, t = op
            assert held[(half, b)][0] == t
            parts[(t, half)] = parts.get((t, half), 0) + 1
        elif kind == "store_k":
            mine = {t for t in range(t_both, n_tiles) if t % 2 == 1 - op[1]}
            assert mine <= read_pairs, f"{where}: K half {op[1]} overwritten before the other's products read it"
        pending[h] = next(programs[h], None)
    expected = {(t, half): 1 for half in (0, 1) for t in range(t_first[half], n_tiles)}
    assert parts == expected, f"{where}: dQ parts {parts} against {expected}"


@pytest.mark.parametrize("q_tile,k_half", [(64, 64), (128, 64), (64, 128)])
@pytest.mark.parametrize("n", [1, 63, 64, 65, 127, 128, 129, 192, 257, 960, 1000, 1090, 2048, 2113])
def test_handshake_never_deadlocks_and_sums_every_part_once(n, q_tile, k_half):
    rng = random.Random(n * 1000 + q_tile + k_half)
    for k_start in range(0, n, 2 * k_half):
        for _ in range(8):
            run_cta(n, k_start, q_tile, k_half, rng)


def test_the_checker_catches_a_wrong_phase_and_a_missing_wait(monkeypatch):
    """The checker itself, so that a pass means something: every wait one phase late (what an off-by-one in
    the phase arithmetic would do), and the waits before reusing a dS^T buffer left out, are both reported."""
    module = sys.modules[__name__]
    late = lambda t, b, t_both: _paired_before.fn(t, b, t_both) + 1  # noqa: E731
    monkeypatch.setattr(module, "paired_before", late)
    with pytest.raises(AssertionError, match="deadlock|passed"):
        for seed in range(20):
            run_cta(2048, 0, 64, 64, random.Random(seed))
    monkeypatch.undo()

    kernel_order = warpgroup

    def without_buffer_waits(h, n_tiles, t_first, t_both):
        ops = list(kernel_order(h, n_tiles, t_first, t_both))
        yield from (op for op in ops[:-2] if op[:2] != ("wait", ("ds_free", 1 - h)))
        yield from ops[-2:]

    monkeypatch.setattr(module, "warpgroup", without_buffer_waits)
    with pytest.raises(AssertionError, match="overwritten unread"):
        for seed in range(50):
            run_cta(2048, 0, 64, 64, random.Random(seed))


# --- d = 128 (`flash_gluon_backward_d128`): both warpgroups visit every query tile, last to first; each
# computes a column half of the previous visit's dQ part from both warpgroups' dS, so both read both buffers.

from cs336_systems.attention.kernels.gluon_backward_d128 import ds_free_phase, ds_ready_phase  # noqa: E402

ready_phase, free_phase = ds_ready_phase.fn, ds_free_phase.fn


def warpgroup_d128(h: int, n_tiles: int, free_waits: bool = True):
    """The operations warpgroup h issues, in its program order (`_query_tiles` and `_consumer`): visit i's
    dS stored after its buffer's previous readers are done, the previous visit's column half after both
    dS of it are stored, K overwritten after both warpgroups' last products."""
    for i in range(n_tiles):
        if free_waits:
            yield "wait", ("ds_free", i % 2), free_phase(i), i // 2  # completion of visit i - 2's readers
        yield "store_ds", h, i % 2, i
        yield "arrive", ("ds_ready", i % 2)
        if i > 0:
            yield "wait", ("ds_ready", (i - 1) % 2), ready_phase(i - 1), (i - 1) // 2 + 1
            yield "dq_half", h, i - 1
            yield "arrive", ("ds_free", (i - 1) % 2)
    last = n_tiles - 1
    yield "wait", ("ds_ready", last % 2), ready_phase(last), last // 2 + 1
    yield "dq_half", h, last
    yield "arrive", ("ds_free", last % 2)
    yield "wait", ("ds_free", last % 2), ready_phase(last), last // 2 + 1
    yield "store_k", h


def run_cta_d128(n_tiles: int, rng: random.Random, program=None) -> None:
    program = program or warpgroup_d128
    bars = {(name, b): Barrier(2) for name in ("ds_ready", "ds_free") for b in (0, 1)}
    held: dict[tuple[int, int], list] = {}  # (half, parity) -> [visit, column halves still to read it]
    halves: dict[int, set[int]] = {}
    programs = {h: program(h, n_tiles) for h in (0, 1)}
    pending = {h: next(programs[h], None) for h in (0, 1)}
    where = f"{n_tiles} visits"
    while any(op is not None for op in pending.values()):
        runnable = [h for h, op in pending.items() if op is not None and (op[0] != "wait" or bars[op[1]].passes(op[2]))]
        assert runnable, f"deadlock at {where}: {pending}"
        h = rng.choice(runnable)
        op = pending[h]
        if op[0] == "wait":
            _, bar, _, needed = op
            assert bars[bar].completed >= needed, f"{where}: warpgroup {h} passed {bar} before completion {needed}"
        elif op[0] == "arrive":
            bars[op[1]].arrive()
        elif op[0] == "store_ds":
            _, half, b, i = op
            assert not held.get((half, b), [None, set()])[1], f"{where}: dS buffer {(half, b)} overwritten unread"
            held[(half, b)] = [i, {0, 1}]
        elif op[0] == "dq_half":
            _, col, i = op
            for half in (0, 1):
                assert held.get((half, i % 2), [None])[0] == i, f"{where}: visit {i}'s product read {(half, i % 2)}"
                held[(half, i % 2)][1].discard(col)
            halves.setdefault(i, set()).add(col)
        elif op[0] == "store_k":
            assert all(not readers for _, readers in held.values()), f"{where}: K overwritten before the last products"
        pending[h] = next(programs[h], None)
    assert halves == {i: {0, 1} for i in range(n_tiles)}, f"{where}: dQ column halves {halves}"


@pytest.mark.parametrize("n_tiles", [1, 2, 3, 4, 5, 8, 17, 64])
def test_d128_handshake_never_deadlocks_and_adds_every_column_half_once(n_tiles):
    rng = random.Random(n_tiles)
    for _ in range(40):
        run_cta_d128(n_tiles, rng)


def test_the_d128_checker_catches_a_late_phase_and_a_missing_wait():
    """A wait for the visit before (an off-by-one in `ds_ready_phase`) and stores without the ds_free wait
    are both reported."""

    def late(h, n_tiles):
        for op in warpgroup_d128(h, n_tiles):
            if op[0] == "wait" and op[1][0] == "ds_ready":
                op = ("wait", op[1], op[2] ^ 1, op[3])
            yield op

    with pytest.raises(AssertionError, match="deadlock|passed"):
        for seed in range(20):
            run_cta_d128(8, random.Random(seed), late)

    with pytest.raises(AssertionError, match="overwritten"):
        for seed in range(50):
            run_cta_d128(8, random.Random(seed), lambda h, n_tiles: warpgroup_d128(h, n_tiles, free_waits=False))
