"""The leaderboard step kernel by kernel: what each implementation's GPU time goes to.

One step is the leaderboard's forward+backward (`flash_leaderboard.py`): `o = f(q, k, v, True)`,
`o.sum().backward()` with q, k, v the slices of one leaf. Each step is recorded by torch.profiler
(CUDA activity only) after warm-up steps, and every kernel gets a phase from where it runs:

  forward   the implementation's kernels before the loss
  harness   the step's own kernels, the same whatever the implementation: the loss's reduction
            (`o.sum()`), the ones it backpropagates, the unbind backward that stacks dQ, dK and
            dV into one tensor, and the accumulation into the leaf's gradient
  backward  the implementation's kernels after the loss (its preprocess, main kernel, dQ
            conversion, and a dense copy of the broadcast upstream gradient where it makes one)

The harness's kernels do not depend on the implementation, but they are part of every timed
step, so they pull the ratio of two implementations' step times toward 1.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable

import pandas as pd
import torch

from cs336_systems.benchmarking.harness import free_device_memory
from cs336_systems.benchmarking.timing import round_orders
from cs336_systems.experiments.flash_leaderboard import (
    LEADERBOARD,
    LEADERBOARD_IMPLS,
    LeaderboardConfig,
    leaderboard_implementation,
    leaderboard_inputs,
)

LOSS_KERNEL = re.compile(r"reduce_kernel")
FILL_KERNEL = re.compile(r"FillFunctor")
HARNESS_AFTER_LOSS = {  # kernels the step makes after the loss whatever the implementation
    "unbind backward (stack dQ, dK, dV)": re.compile(r"CatArrayBatchedCopy"),
    "accumulate into the leaf's gradient": re.compile(r"AddFunctor|CUDAFunctor_add"),
}
DENSE_COPY = re.compile(r"direct_copy_kernel")  # o.sum()'s gradient is a broadcast: an implementation may copy it
KERNEL_COLUMNS = ["impl", "position", "phase", "role", "kernel", "start_ms", "ms"]
LEAD_STEPS = 2  # unprofiled steps queued ahead of each profiled one (`_profiled_step`)


def short_kernel_name(name: str, limit: int = 70) -> str:
    """A kernel's name without `void`, namespaces and template arguments, plus the functor of ATen's
    generic elementwise and reduction kernels (which say what they compute only there)."""
    text = name.removeprefix("void ").replace("(anonymous namespace)::", "").strip()
    head = re.split(r"[<(]", text, maxsplit=1)[0]
    base, rest = head.split("::")[-1], text[len(head) :]
    hint = re.search(r"(\w*(?:Functor\w*|_copy_kernel_cuda|ReduceOp|Func)\w*)", rest)
    short = f"{base} [{hint.group(1)}]" if hint and base.endswith(("kernel", "_vectorized")) else base
    return short[:limit]


def classify_kernels(names: list[str]) -> list[tuple[str, str]]:
    """(phase, role) of each kernel of one step, in launch order (module docstring): kernels before
    the loss's reduction are the forward; the reduction (with a memset launched just before it, there in
    every implementation's step on the H100: part of the loss, not of the forward) and the first fill
    after it (the ones of `o.sum()`'s backward) the harness; later ones the backward, except the stack
    and the accumulation."""
    loss = next((i for i, name in enumerate(names) if LOSS_KERNEL.search(name)), None)
    if loss is None:
        raise ValueError(
            f"no loss reduction (a kernel matching {LOSS_KERNEL.pattern!r}) among the step's "
            f"{len(names)} kernels: {[short_kernel_name(n) for n in names]}"
        )
    ones = next((i for i in range(loss + 1, len(names)) if FILL_KERNEL.search(names[i])), None)
    memset = loss - 1 if loss > 0 and names[loss - 1].startswith("Memset") else None
    out = []
    for i, name in enumerate(names):
        if i in (loss, memset):
            out.append(("harness", "loss o.sum()"))
        elif i < loss:
            out.append(("forward", "attention"))
        elif i == ones:
            out.append(("harness", "ones of o.sum()'s backward"))
        else:
            role = next((r for r, pattern in HARNESS_AFTER_LOSS.items() if pattern.search(name)), None)
            if role:
                out.append(("harness", role))
            else:
                out.append(
                    ("backward", "dense copy of the upstream gradient" if DENSE_COPY.search(name) else "attention")
                )
    return out


def _profiled_step(step, lead_steps: int = 0, kernels: int | None = None) -> list[tuple[str, float, float]]:
    """(name, start, duration) in ms of each kernel and memset of one step, start relative to the first.

    With `lead_steps`, the step is queued right behind that many unprofiled steps, which are not waited for:
    the GPU goes from them into the profiled step without the idle gap that a step profiled alone starts
    after (at its power cap, an idle GPU starts the next kernels at a higher clock). Their last kernels may
    run, and be recorded, after the profiler starts: only the last `kernels` events are the step's."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(lead_steps):
        step()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    events = sorted(
        (e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time > 0),
        key=lambda e: e.time_range.start,
    )
    if kernels is not None:
        events = events[-kernels:]
    if not events:
        raise RuntimeError("torch.profiler recorded no CUDA kernel for the step")
    t0 = events[0].time_range.start
    return [(e.name, (e.time_range.start - t0) / 1e3, e.device_time / 1e3) for e in events]


def leaderboard_kernels(
    impls: Iterable[str] = LEADERBOARD_IMPLS,
    config: LeaderboardConfig = LEADERBOARD,
    *,
    device: torch.device | str = "cuda",
    compile: bool = True,
    steps: int = 5,
    warmup_steps: int = 3,
    lead_steps: int = LEAD_STEPS,
) -> pd.DataFrame:
    """One row per implementation and kernel of a leaderboard step (`KERNEL_COLUMNS`): its phase and
    role (`classify_kernels`), and its start and duration in ms, medians over `steps` profiled steps.

    Every implementation is warmed up first, and one step of each profiled alone names its kernels; then the
    profiled steps are taken in rounds, one step of each implementation per round in `round_orders`' rotated
    order, as the timed rounds are: on a GPU at its power cap, steps profiled one implementation after
    another would give the later ones a GPU the earlier ones had heated (tuning record, the power cap). Each runs
    right behind `lead_steps` unprofiled steps of its implementation, on a busy GPU as in the timed runs
    (`_profiled_step`; steps profiled alone, each started from an idle GPU, read shorter than the timed
    steps, cuDNN's by more than ours: docs/flash_attention_tuning.md, the Gluon kernels launched from C++)."""
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"leaderboard_kernels profiles CUDA kernels; got device {device}")
    qkv = leaderboard_inputs(config, device)
    q, k, v = config.views(qkv)

    def step_of(impl):
        def step() -> None:
            with impl.context():
                o = impl.apply(q, k, v, config.is_causal)
            o.sum().backward()

        return step

    names = list(impls)
    step_fns = {name: step_of(leaderboard_implementation(name, compile)) for name in names}
    for name in names:  # the leaf's gradient is kept throughout, so every step adds into it as the timed ones do
        for _ in range(warmup_steps):
            step_fns[name]()
    torch.cuda.synchronize()
    alone = {name: [kernel for kernel, _, _ in _profiled_step(step_fns[name])] for name in names}
    recorded: dict[str, list] = {name: [] for name in names}
    for order in round_orders(names, steps):
        for name in order:
            recorded[name].append(_profiled_step(step_fns[name], lead_steps, len(alone[name])))
    rows = []
    for name in names:
        kernels = alone[name]
        if any([kernel for kernel, _, _ in r] != kernels for r in recorded[name]):
            raise RuntimeError(
                f"{name}: the profiled steps launched different kernels: "
                f"{[[short_kernel_name(k_) for k_, _, _ in r] for r in recorded[name]]}"
            )
        for position, (kernel, (phase, role)) in enumerate(zip(kernels, classify_kernels(kernels))):
            rows.append(
                dict(
                    impl=name,
                    position=position,
                    phase=phase,
                    role=role,
                    kernel=short_kernel_name(kernel),
                    start_ms=statistics.median(r[position][1] for r in recorded[name]),
                    ms=statistics.median(r[position][2] for r in recorded[name]),
                )
            )
    qkv.grad = None
    del step_fns
    free_device_memory()
    return pd.DataFrame(rows, columns=KERNEL_COLUMNS)


def kernel_phase_summary(kernels: pd.DataFrame) -> pd.DataFrame:
    """Per implementation: the ms of its forward, backward and harness kernels, their sum, and the step's
    span on the GPU (first kernel's start to last kernel's end: the sum plus the gaps between kernels)."""
    rows = []
    for impl, group in kernels.groupby("impl", sort=False):
        by_phase = group.groupby("phase").ms.sum()
        last = group.loc[group.start_ms.idxmax()]
        row = dict(impl=impl, **{f"{p}_ms": float(by_phase.get(p, 0.0)) for p in ("forward", "backward", "harness")})
        row["kernels_ms"] = float(group.ms.sum())
        row["span_ms"] = float(last.start_ms + last.ms)
        row["gaps_ms"] = row["span_ms"] - row["kernels_ms"]
        rows.append(row)
    return pd.DataFrame(
        rows, columns=["impl", "forward_ms", "backward_ms", "harness_ms", "kernels_ms", "span_ms", "gaps_ms"]
    )


def kernel_profile_text(
    kernels: pd.DataFrame,
    phases: pd.DataFrame,
    steps: int,
    lead_steps: int = LEAD_STEPS,
    timed_ms: pd.Series | None = None,
) -> str:
    """The report's reading of `leaderboard_kernels` and `kernel_phase_summary`: each implementation's harness
    kernels, ours against SDPA-cuDNN kernel by kernel where both were profiled, the dense copies of the
    broadcast upstream gradient, and where given the timed forward+backward per implementation (`timed_ms`)
    beside the profiled kernels' sum."""
    from cs336_systems.report.tables import fmt_ms

    by = phases.set_index("impl")
    behind = (
        f", each queued right behind {lead_steps} unprofiled steps (a busy GPU, as in the timed runs)"
        if lead_steps
        else ""
    )
    text = [
        f"Medians of {steps} profiled steps{behind}. The harness's kernels take "
        + ", ".join(f"{fmt_ms(r.harness_ms)} ({r.Index})" for r in by.itertuples())
        + "."
    ]
    if {"triton", "sdpa_cudnn"} <= set(by.index):
        o, c = by.loc["triton"], by.loc["sdpa_cudnn"]
        attention = (o.forward_ms + o.backward_ms) / (c.forward_ms + c.backward_ms)
        text.append(
            f"Ours against SDPA-cuDNN, kernels only: forward {fmt_ms(o.forward_ms)} against {fmt_ms(c.forward_ms)} "
            f"({o.forward_ms / c.forward_ms:.3f}×), backward {fmt_ms(o.backward_ms)} against "
            f"{fmt_ms(c.backward_ms)} ({o.backward_ms / c.backward_ms:.3f}×), attention kernels together "
            f"**{attention:.3f}×**; with the harness's kernels the sums are {fmt_ms(o.kernels_ms)} against "
            f"{fmt_ms(c.kernels_ms)} ({o.kernels_ms / c.kernels_ms:.3f}×)."
        )
    copies = kernels[kernels.role == "dense copy of the upstream gradient"].groupby("impl").ms.sum()
    per_impl = [f"{fmt_ms(copies[impl])} ({impl})" if impl in copies.index else f"none ({impl})" for impl in by.index]
    text.append(
        "The dense copy of the broadcast upstream gradient (`o.sum()` backpropagates a stride-0 tensor), "
        "counted in the backward: " + ", ".join(per_impl) + "."
    )
    text.append(
        "The spans in the second table include the gaps between kernels, where the GPU waited for the host; "
        "the profiler adds its own host time per launch, so those gaps are not the timed runs'."
    )
    if timed_ms is not None:
        pairs = [(impl, by.loc[impl].kernels_ms, float(timed_ms[impl])) for impl in by.index if impl in timed_ms.index]
        text.append(
            "The profiled kernels' sum against the timed forward+backward: "
            + ", ".join(f"{fmt_ms(k)} against {fmt_ms(t)} ({k / t:.3f}×, {impl})" for impl, k, t in pairs)
            + ". A few profiled steps need not run at the clock of the timed rounds (the GPU's power cap sets it "
            "from the work of the last moments), so the bars read the timed rounds and this profile says where "
            "a step's time goes."
        )
    return " ".join(text)
