"""The fused Gluon backward at head dimension 128 on one GPU, in one process: correctness against float64
(ragged N, causal and not, bf16 and fp16, the size limits lifted), then the backward alone and the forward
at the 2026 leaderboard model's attention shape, in rounds whose order rotates, against the two Triton
backward kernels and SDPA's cuDNN and flash backends. Writes every timing as CSV rows, prints a summary.

    python tools/flash_d128_bench.py OUT.csv [--rounds 4] [--ms 2000] [--regs 240,24 232,40]
        [--shape 1,32,32768,128 ...] [--variant NAME=PATH[:STAGES] ...] [--skip triton sdpa_flash]

A variant is a candidate kernel module (PATH defines `flash_bwd_gluon_d128_kernel` with the shipped kernel's
signature), launched by the library's host code with its STAGES (default the shipped ones).

Run on a Hopper GPU. Each candidate's times go to the tuning record (docs/flash_attention_tuning.md).
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import statistics

import torch
import torch.nn.functional as F
import triton.testing
from torch.nn.attention import SDPBackend, sdpa_kernel

from cs336_systems.attention import heuristics
from cs336_systems.attention.api import FlashAttentionTriton
from cs336_systems.attention.launch import gluon as G
from cs336_systems.attention.launch.dispatch import flash_backward_triton
from cs336_systems.attention.launch.layout import head_views
from cs336_systems.attention.reference import reference_gradients
from cs336_systems.attention.reference import relative_error as rel
from cs336_systems.benchmarking.timing import round_orders


def model_layout(batch: int, heads: int, n: int, d: int, dtype, seed: int) -> list[torch.Tensor]:
    """q, k, v as the model makes them: (b, h, n, d) views of (b, n, h d) projections, leaves."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return [
        head_views(torch.randn(batch, n, heads * d, device="cuda", dtype=dtype, generator=gen), heads).requires_grad_()
        for _ in range(3)
    ]


def triton_only(fn):
    """fn run with the fused backward out of scope at its head dimension: the two Triton kernels."""

    def run():
        scope = {d: list(c) for d, c in heuristics.GLUON_BWD_CAUSALITY.items()}
        heuristics.GLUON_BWD_CAUSALITY.pop(128, None)
        try:
            return fn()
        finally:
            heuristics.GLUON_BWD_CAUSALITY.update({d: tuple(c) for d, c in scope.items()})

    return run


SKIPPED: set[str] = set()  # routes not timed, from --skip
VARIANTS: dict[str, tuple] = {}  # name -> (kernel, tiles or None), from --variant


def load_variant(spec: str) -> None:
    name, _, rest = spec.partition("=")
    path, _, stages = rest.partition(":")
    module_spec = importlib.util.spec_from_file_location(f"variant_{name}", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    tiles = (*heuristics.GLUON_BWD_TILES[128][:2], int(stages)) if stages else None
    VARIANTS[name] = (module.flash_bwd_gluon_d128_kernel, tiles)


def backward_routes(q, k, v, do, causal: bool, regs_list) -> tuple:
    """Our forward, and name -> backward of each route from its saved tensors (contiguous, as the
    library hands them to the backward kernels)."""
    forward = lambda: FlashAttentionTriton.apply(q, k, v, causal)  # noqa: E731
    out = forward()
    lse = out.grad_fn.saved_tensors[0]
    o = out.detach().contiguous()
    qc, kc, vc, doc = (t.detach().contiguous() for t in (q, k, v, do))
    n, d = q.shape[-2:]
    section = heuristics.gluon_sections(n, d, q.element_size(), q.numel() // (n * d), causal)[1]
    routes = {
        f"gluon_{r[0]}_{r[1]}": (lambda r=r: G._backward(qc, kc, vc, o, doc, lse, causal, section, regs=r))
        for r in regs_list
    }
    for name, (kernel, tiles) in VARIANTS.items():
        routes[name] = lambda kernel=kernel, tiles=tiles: G._backward(
            qc, kc, vc, o, doc, lse, causal, section, tiles=tiles, kernel=kernel
        )
    routes["triton"] = triton_only(lambda: flash_backward_triton(qc, kc, vc, o, doc, lse, causal))
    return forward, routes


def check(shape, causal: bool, dtype, rows: list[dict]) -> None:
    """O, dQ, dK, dV of the Gluon and the Triton routes against float64."""
    b, h, n, d = shape
    q, k, v = model_layout(b, h, n, d, dtype, seed=n + int(causal))
    do = torch.randn_like(q)
    ref = reference_gradients(q.detach(), k.detach(), v.detach(), do, causal)
    forward, routes = backward_routes(q, k, v, do, causal, [heuristics.GLUON_BWD_REGS[128]])
    out = forward()
    for route, backward in routes.items():
        grads = backward()
        errs = {name: rel(x, ref[name]) for name, x in zip(("O", "dQ", "dK", "dV"), (out, *grads))}
        rows.append(dict(kind="check", route=route, shape=str(shape), causal=causal, dtype=str(dtype), **errs))
        print("check", route, shape, causal, dtype, {k_: f"{v_:.2e}" for k_, v_ in errs.items()}, flush=True)


def timers(q, k, v, do, causal: bool, regs_list) -> dict:
    """name -> (forward fn, backward fn); SDPA's backward re-runs autograd.grad on a kept graph."""

    def sdpa(backend):
        def fwd():
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        return fwd

    def graph_backward(fwd):
        out = fwd()
        return lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True)

    result = {
        name: (sdpa(backend), graph_backward(sdpa(backend)))
        for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa_flash", SDPBackend.FLASH_ATTENTION))
    }
    forward, routes = backward_routes(q, k, v, do, causal, regs_list)
    result.update({name: (forward, backward) for name, backward in routes.items()})
    return {name: fns for name, fns in result.items() if name not in SKIPPED}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--ms", type=int, default=2000)
    parser.add_argument("--regs", nargs="*", default=["240,24", "232,40"])
    parser.add_argument("--skip-check", action="store_true")
    parser.add_argument("--variant", nargs="*", default=[], help="NAME=PATH[:STAGES] of a candidate kernel")
    parser.add_argument("--skip", nargs="*", default=[], help="routes not timed (e.g. triton sdpa_flash)")
    parser.add_argument("--shape", nargs="*", default=["1,32,32768,128"], help="b,h,N,d of each timed shape")
    args = parser.parse_args()
    regs_list = [tuple(int(x) for x in r.split(",")) for r in args.regs]
    for spec in args.variant:
        load_variant(spec)
    SKIPPED.update(args.skip)
    rows: list[dict] = []
    heuristics.MIN_SEQ_LEN, heuristics.MIN_CTAS_PER_SM = (
        {d: 0 for d in heuristics.MIN_SEQ_LEN},
        {d: 0 for d in heuristics.MIN_CTAS_PER_SM},
    )  # small shapes through the Gluon route
    if not args.skip_check:
        for shape in [(2, 3, 1000, 128), (1, 4, 2048, 128), (1, 2, 960, 128), (1, 1, 1090, 128), (1, 2, 4160, 128)]:
            for causal in (True, False):
                check(shape, causal, torch.bfloat16, rows)
        check((1, 2, 1000, 128), True, torch.float16, rows)
    shapes = [tuple(int(x) for x in sh.split(",")) for sh in args.shape]
    for shape, causal in [(sh, c) for sh in shapes for c in (True, False)]:
        q, k, v = model_layout(*shape, torch.bfloat16, seed=0)
        do = torch.randn_like(q)
        fns = timers(q, k, v, do, causal, regs_list)
        names = list(fns)
        for r, order in enumerate(round_orders(names, args.rounds)):
            for name in order:
                fwd, bwd = fns[name]
                for kind, fn in (("fwd", fwd), ("bwd", bwd)):
                    ms = triton.testing.do_bench(fn, warmup=200, rep=args.ms // args.rounds, return_mode="median")
                    rows.append(
                        dict(
                            kind=kind,
                            route=name,
                            shape=str(shape),
                            causal=causal,
                            round=r,
                            ms=ms,
                            device=torch.cuda.get_device_name(),
                        )
                    )
        for name in names:
            med = {
                kind: statistics.median(
                    r_["ms"]
                    for r_ in rows
                    if r_.get("route") == name
                    and r_["kind"] == kind
                    and r_["causal"] == causal
                    and r_["shape"] == str(shape)
                )
                for kind in ("fwd", "bwd")
            }
            print(f"{shape} causal={causal} {name:>16}: fwd {med['fwd']:.2f} ms  bwd {med['bwd']:.2f} ms", flush=True)
        del q, k, v, do, fns
        torch.cuda.empty_cache()
    keys = sorted({k_ for r_ in rows for k_ in r_})
    with open(args.out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
