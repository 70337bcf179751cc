"""Ring collectives: closed-form times and a step-by-step simulation on in-process "devices".

Setting of the spring 2026 handout, §8.1: N devices in a ring, each sends W bytes/s to its right
neighbour, all devices send at the same time, so one step lasts (largest message) / W.

    ring all-gather      (N−1)/N · S/W    S = size of the gathered tensor, N−1 steps of S/N
    ring reduce-scatter  (N−1)/N · S/W    S = size of each device's input, N−1 steps of S/N
    ring all-reduce      2 (N−1)/N · S/W  reduce-scatter, then all-gather of the reduced chunks
    alternate all-reduce (N−1) · S/W      every device forwards one whole x^(i) per step

The time functions are plain arithmetic, so they take numbers or sympy symbols alike. The
simulations move tensors between list entries (one per device), count the bytes each device
sends in each step, and return what every device ends up holding, so a test can check both the
result (against the true sum or concatenation) and the time (against the closed form).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch

from cs336_systems.accounting.symbolic import Quantity


def _check_device_count(n: Quantity) -> None:
    if isinstance(n, int) and n < 1:
        raise ValueError(f"a ring needs at least one device, got N={n}")


def ring_all_gather_time(size_bytes: Quantity, n: Quantity, bandwidth: Quantity) -> Quantity:
    """(N−1)/N · S/W: N−1 steps, each device sends one chunk of S/N bytes per step."""
    _check_device_count(n)
    return (n - 1) / n * size_bytes / bandwidth


def ring_reduce_scatter_time(size_bytes: Quantity, n: Quantity, bandwidth: Quantity) -> Quantity:
    """(N−1)/N · S/W: the all-gather's schedule, adding each received chunk into a partial sum."""
    _check_device_count(n)
    return (n - 1) / n * size_bytes / bandwidth


def ring_all_reduce_time(size_bytes: Quantity, n: Quantity, bandwidth: Quantity) -> Quantity:
    """2 (N−1)/N · S/W: a ring reduce-scatter followed by a ring all-gather of the reduced chunks."""
    return ring_reduce_scatter_time(size_bytes, n, bandwidth) + ring_all_gather_time(size_bytes, n, bandwidth)


def alternate_ring_all_reduce_time(size_bytes: Quantity, n: Quantity, bandwidth: Quantity) -> Quantity:
    """(N−1) · S/W: N−1 steps, each device forwards a whole input x^(i) of S bytes per step.

    That is N/2 times the reduce-scatter + all-gather ring, which only ever sends chunks of S/N.
    """
    _check_device_count(n)
    return (n - 1) * size_bytes / bandwidth


@dataclass
class RingRun:
    """What a simulated collective left on each device and the bytes each device sent per step."""

    outputs: list[torch.Tensor]
    bytes_sent: list[list[int]]  # [step][device]

    @property
    def steps(self) -> int:
        return len(self.bytes_sent)

    def time(self, bandwidth: float) -> float:
        """Σ_steps max_device(bytes sent) / W: devices send in parallel, a step ends with the slowest."""
        return sum(max(step) for step in self.bytes_sent) / bandwidth

    def then(self, other: RingRun) -> RingRun:
        return RingRun(outputs=other.outputs, bytes_sent=self.bytes_sent + other.bytes_sent)


def _check_devices(tensors: list[torch.Tensor]) -> None:
    if len(tensors) < 1:
        raise ValueError("a ring needs at least one device, got an empty list")
    first = tensors[0]
    for i, t in enumerate(tensors):
        if t.shape != first.shape or t.dtype != first.dtype:
            raise ValueError(
                f"device {i} holds a {tuple(t.shape)} {t.dtype} tensor, "
                f"device 0 a {tuple(first.shape)} {first.dtype} one"
            )


def _ring_step(outgoing: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[int]]:
    """Device i sends outgoing[i] to device i+1; returns what each device received and the bytes sent."""
    n = len(outgoing)
    received = [outgoing[(i - 1) % n].clone() for i in range(n)]
    return received, [t.numel() * t.element_size() for t in outgoing]


def simulate_ring_all_gather(chunks: list[torch.Tensor]) -> RingRun:
    """Device i starts with chunk x_i; at step t it forwards x_{(i−t+1) mod N}, the one it got last."""
    _check_devices(chunks)
    n = len(chunks)
    held = [{i: chunks[i].clone()} for i in range(n)]
    bytes_sent = []
    for t in range(1, n):
        received, sent = _ring_step([held[i][(i - t + 1) % n] for i in range(n)])
        for i in range(n):
            held[i][(i - t) % n] = received[i]
        bytes_sent.append(sent)
    outputs = [torch.cat([held[i][k] for k in range(n)]) for i in range(n)]
    return RingRun(outputs=outputs, bytes_sent=bytes_sent)


def simulate_ring_reduce_scatter(tensors: list[torch.Tensor]) -> RingRun:
    """Device i splits x^(i) into N chunks along dim 0; at step t it sends partial sum y_{(i−t) mod N}
    and adds the received z_{(i−t−1) mod N} into its own y_{(i−t−1) mod N}. Device i ends with y_i."""
    _check_devices(tensors)
    n = len(tensors)
    if tensors[0].shape[0] % n:
        raise ValueError(f"dim 0 of size {tensors[0].shape[0]} does not split into N={n} equal chunks")
    partial = [list(t.clone().chunk(n)) for t in tensors]
    bytes_sent = []
    for t in range(1, n):
        received, sent = _ring_step([partial[i][(i - t) % n] for i in range(n)])
        for i in range(n):
            k = (i - t - 1) % n
            partial[i][k] = partial[i][k] + received[i]
        bytes_sent.append(sent)
    return RingRun(outputs=[partial[i][i] for i in range(n)], bytes_sent=bytes_sent)


def simulate_ring_all_reduce(tensors: list[torch.Tensor]) -> RingRun:
    """Ring reduce-scatter, then ring all-gather of the N reduced chunks."""
    scattered = simulate_ring_reduce_scatter(tensors)
    return scattered.then(simulate_ring_all_gather(scattered.outputs))


def simulate_alternate_ring_all_reduce(tensors: list[torch.Tensor]) -> RingRun:
    """y ← x^(i); at step t device i sends x^((i−t+1) mod N) and adds the received x^((i−t) mod N) to y."""
    _check_devices(tensors)
    n = len(tensors)
    total = [t.clone() for t in tensors]
    forwarding = [t.clone() for t in tensors]
    bytes_sent = []
    for _ in range(1, n):
        forwarding, sent = _ring_step(forwarding)
        total = [y + x for y, x in zip(total, forwarding)]
        bytes_sent.append(sent)
    return RingRun(outputs=total, bytes_sent=bytes_sent)


def ring_simulation_table(
    device_counts: list[int],
    numel_per_device: int,
    bandwidth: float,
    seed: int = 0,
) -> pd.DataFrame:
    """One row per (collective, N): simulated vs closed-form time (W = `bandwidth` bytes/s) and the
    largest error of any device's result against the true concatenation or sum.

    S is the size the closed form takes: the gathered tensor for the all-gather, one device's input
    for the reductions. Every device holds `numel_per_device` float64 values (the chunk x_i for the all-gather, the
    full x^(i) for the reductions); `numel_per_device` must be divisible by each N.
    """
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for n in device_counts:
        xs = [torch.randn(numel_per_device, generator=gen, dtype=torch.float64) for _ in range(n)]
        size = xs[0].numel() * xs[0].element_size()
        total = torch.stack(xs).sum(0)
        cases = [  # name, simulated run, what every device should hold, S, closed form
            ("ring all-gather", simulate_ring_all_gather(xs), [torch.cat(xs)] * n, n * size, ring_all_gather_time),
            (
                "ring reduce-scatter",
                simulate_ring_reduce_scatter(xs),
                list(total.chunk(n)),
                size,
                ring_reduce_scatter_time,
            ),
            ("ring all-reduce", simulate_ring_all_reduce(xs), [total] * n, size, ring_all_reduce_time),
            (
                "alternate ring all-reduce",
                simulate_alternate_ring_all_reduce(xs),
                [total] * n,
                size,
                alternate_ring_all_reduce_time,
            ),
        ]
        for name, run, expected, s_bytes, closed_form in cases:
            error = max((out - want).abs().max().item() for out, want in zip(run.outputs, expected))
            rows.append(
                dict(
                    collective=name,
                    N=n,
                    S_bytes=s_bytes,
                    steps=run.steps,
                    simulated_time_s=run.time(bandwidth),
                    closed_form_time_s=closed_form(s_bytes, n, bandwidth),
                    max_abs_error=error,
                )
            )
    return pd.DataFrame(rows)
