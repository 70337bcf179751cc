"""Host time of eager attention calls: how long the CPU spends per call of the forward, the backward
(`o.backward(do, retain_graph=True)`) and forward+backward, ours against SDPA's backends, with the GPU
kept far behind (the calls are issued back to back after one synchronize, so the host never waits for
the device), and where ours spends it (cProfile of the backward and of forward+backward).

    python tools/flash_host_probe.py [--calls 300] [--shapes 1x1024x64 1x4096x128]

A shape is heads x N x d (batch 1, bf16, causal), as in notebook 10's grid. Run on a GPU machine.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import io
import pstats
import statistics
import time

import torch

from cs336_systems.benchmarking.attention_registry import implementation


class _Floor(torch.autograd.Function):
    """The least a Python autograd node costs: the forward allocates its output, the backward three gradients."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal):
        ctx.save_for_backward(q, k, v)
        return torch.empty_like(q)

    @staticmethod
    def backward(ctx, grad):
        q, k, v = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), None


def host_us(fn, calls: int) -> float:
    """Median over 5 batches of the host time per call, the device synchronized only between batches."""
    per_call = []
    for _ in range(5):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        per_call.append((time.perf_counter() - start) / calls * 1e6)
    torch.cuda.synchronize()
    return statistics.median(per_call)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--shapes", nargs="*", default=["1x1024x64", "1x4096x64", "1x1024x16", "1x1024x128"])
    parser.add_argument("--diagnose", action="store_true", help="forward+backward variants and a profiler table")
    args = parser.parse_args()
    if args.diagnose:
        diagnose(args.calls, args.shapes[0])
        return
    from cs336_systems.attention.api import FlashAttentionTriton
    from cs336_systems.attention.launch import native as flash_native

    impls = {name: implementation(name).apply for name in ("triton", "sdpa_flash")}
    impls["triton python node"] = FlashAttentionTriton.python_apply
    impls["python node floor"] = _Floor.apply
    flash_native.load()
    print(f"C++ autograd node: {flash_native.status()}")
    print(f"{'shape':>12s} {'impl':>18s} {'forward':>9s} {'backward':>9s} {'fwd+bwd':>9s}  (µs of host time per call)")
    for shape in args.shapes:
        heads, n, d = (int(x) for x in shape.split("x"))
        q, k, v = (
            torch.randn(1, heads, n, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)
        )
        do = torch.randn(1, heads, n, d, device="cuda", dtype=torch.bfloat16)
        for name, apply in impls.items():
            with implementation(name).context() if name in ("triton", "sdpa_flash") else contextlib.nullcontext():
                # triton: flash_attention_triton, through the C++ node where it serves the geometry
                for _ in range(3):
                    apply(q, k, v, True).backward(do)
                fwd = host_us(lambda: apply(q, k, v, True), args.calls)
                o = apply(q, k, v, True)
                bwd = host_us(lambda: o.backward(do, retain_graph=True), args.calls)
                both = host_us(lambda: apply(q, k, v, True).backward(do), args.calls)
            print(f"{shape:>12s} {name:>18s} {fwd:9.1f} {bwd:9.1f} {both:9.1f}", flush=True)
        q.grad = k.grad = v.grad = None
    heads, n, d = (int(x) for x in args.shapes[0].split("x"))
    q, k, v = (torch.randn(1, heads, n, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    do = torch.randn_like(q)
    ours = impls["triton"]
    for label, fn in (("forward+backward", lambda: ours(q, k, v, True).backward(do)),):
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(args.calls):
            fn()
        profile.disable()
        torch.cuda.synchronize()
        for order in ("tottime", "cumulative"):
            out = io.StringIO()
            pstats.Stats(profile, stream=out).sort_stats(order).print_stats(28)
            text = out.getvalue()
            print(
                f"\ncProfile of {args.calls} calls, {label}, {args.shapes[0]}, by {order}:\n"
                + text[text.find("ncalls") :]
            )


def diagnose(calls: int, shape: str) -> None:
    """Which part of our forward+backward costs host time beyond the forward's and the backward's."""
    heads, n, d = (int(x) for x in shape.split("x"))
    q, k, v = (torch.randn(1, heads, n, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    do = torch.randn_like(q)
    kept = []
    for name in ("triton", "sdpa_flash"):
        apply = implementation(name).apply
        with implementation(name).context():

            def single_thread():
                with torch.autograd.set_multithreading_enabled(False):
                    apply(q, k, v, True).backward(do)

            variants = {
                "o.backward(do)": lambda: apply(q, k, v, True).backward(do),
                "one thread": single_thread,
                "autograd.grad": lambda: torch.autograd.grad(apply(q, k, v, True), (q, k, v), do),
                "graph kept alive": lambda: kept.append(apply(q, k, v, True)) or kept[-1].backward(do),
                "forward only": lambda: apply(q, k, v, True),
            }
            if name == "triton":
                from cs336_systems.attention.launch.dispatch import flash_backward_triton, flash_forward_triton

                def without_engine():
                    out, lse = flash_forward_triton(q, k, v, True)
                    flash_backward_triton(q, k, v, out, do, lse, True)

                variants["kernels, no autograd"] = without_engine
            for label, fn in variants.items():
                for _ in range(3):
                    fn()
                print(f"{name:>12s} {label:>20s} {host_us(fn, calls):8.1f} µs", flush=True)
                kept.clear()
            parts = {"apply": [], "backward": [], "del": []}
            torch.cuda.synchronize()
            for _ in range(calls):
                t0 = time.perf_counter()
                o = apply(q, k, v, True)
                t1 = time.perf_counter()
                o.backward(do)
                t2 = time.perf_counter()
                del o
                t3 = time.perf_counter()
                for key, dt in zip(parts, (t1 - t0, t2 - t1, t3 - t2)):
                    parts[key].append(dt * 1e6)
            torch.cuda.synchronize()
            print(
                f"{name:>12s} forward+backward split, medians: "
                + ", ".join(f"{key} {statistics.median(v):.1f} µs" for key, v in parts.items()),
                flush=True,
            )
            gc.disable()
            print(f"{name:>12s} {'gc disabled':>20s} {host_us(variants['o.backward(do)'], calls):8.1f} µs", flush=True)
            gc.enable()
            q.grad = k.grad = v.grad = None


if __name__ == "__main__":
    main()
