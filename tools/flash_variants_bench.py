"""A/B of the fused Gluon backward's variants on one GPU, in one process: correctness against float64
and the shipped kernel first, then the backward alone and the leaderboard step (compiled,
`o.sum().backward()`), in rounds whose order rotates, against SDPA-cuDNN in the same rounds. Writes
every timing as CSV rows and prints a summary.

    python tools/flash_variants_bench.py OUT.csv [--rounds 4] [--kernel-ms 400] [--step-ms 1500]
    ncu -k regex:flash_bwd_gluon -c 1 python tools/flash_variants_bench.py x --launch-once VARIANT

A variant is a copy of `flash_gluon_backward.py` with one change, saved as tools/variants/NAME.py
(ignored by git: the tuning record describes each and docs/flash_v15_h100.csv holds its timings) and
named in VARIANTS; the first entry is the library's own kernel. Run on a GPU machine.
"""

from __future__ import annotations

import argparse
import csv
import importlib
import statistics
import sys
from pathlib import Path

import torch
import triton.testing

from cs336_systems.attention import heuristics
from cs336_systems.attention.api import FlashAttentionTriton
from cs336_systems.attention.launch import gluon as G
from cs336_systems.attention.reference import reference_gradients
from cs336_systems.attention.reference import relative_error as rel
from cs336_systems.benchmarking.attention_registry import implementation
from cs336_systems.benchmarking.timing import round_orders


def use_backward_kernel(module: str | None):
    """The fused backward's kernel taken from `module` (a copy of flash_gluon_backward with a change), or
    the shipped one (None)."""
    from cs336_systems.attention.kernels import gluon_backward as shipped

    original = shipped.__dict__.setdefault("_shipped_kernel", shipped.flash_bwd_gluon_kernel)

    def apply() -> None:
        shipped.flash_bwd_gluon_kernel = (
            original if module is None else importlib.import_module(module).flash_bwd_gluon_kernel
        )

    return apply


sys.path.insert(0, str(Path(__file__).parent / "variants"))
# Keys as the tuning record names the kernels. None is the library's kernel (L and D rows loaded a tile ahead,
# one element per thread); bwd_v12 the one before it (where to get its source: docs/measurements_record.md);
# bwd_compact loads one element per thread in the tile that uses them
VARIANTS = {
    "v15": use_backward_kernel(None),
    "v12": use_backward_kernel("bwd_v12"),
    "compact": use_backward_kernel("bwd_compact"),
}
SHIPPED = "v15"


def check(variant: str, heads: int, n: int, d: int, causal: bool, rows: list[dict]) -> None:
    """O, L, dQ, dK, dV against float64 (the first and last head), O and L against the shipped kernel."""
    gen = torch.Generator(device="cuda").manual_seed(n + d)
    q, k, v = (torch.randn(1, heads, n, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
    do = torch.randn(1, heads, n, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    VARIANTS[SHIPPED]()
    out0 = torch.full_like(q, float("nan"))
    lse0 = torch.full(q.shape[:-1], float("nan"), device="cuda")
    G._launch(q, k, v, out0, lse0, causal)
    VARIANTS[variant]()
    out = torch.full_like(q, float("nan"))
    lse = torch.full(q.shape[:-1], float("nan"), device="cuda")
    G._launch(q, k, v, out, lse, causal)
    VARIANTS[SHIPPED]()
    shipped_grads = []
    for _ in range(2):
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        FlashAttentionTriton.python_apply(qg, kg, vg, causal).backward(do)
        shipped_grads.append((qg.grad, kg.grad, vg.grad))
        VARIANTS[variant]()
    (dq0, dk0, dv0), (dq1, dk1, dv1) = shipped_grads  # the second: the variant's
    sel = [0, heads - 1]
    ref = reference_gradients(q[:, sel], k[:, sel], v[:, sel], do[:, sel], causal)
    errs = dict(
        o=rel(out[:, sel], ref["O"]),
        dq=rel(qg.grad[:, sel], ref["dQ"]),
        dk=rel(kg.grad[:, sel], ref["dK"]),
        dv=rel(vg.grad[:, sel], ref["dV"]),
    )
    same = bool(torch.equal(out, out0) and torch.equal(lse, lse0) and torch.equal(dk0, dk1) and torch.equal(dv0, dv1))
    dq_vs_shipped = rel(dq1, dq0)  # dQ's reduce-adds run in no fixed order
    finite = bool(torch.isfinite(out).all() and torch.isfinite(lse).all())
    row = dict(
        kind="check",
        variant=variant,
        heads=heads,
        n=n,
        d=d,
        causal=causal,
        same_as_shipped=same,
        finite=finite,
        dq_vs_shipped=dq_vs_shipped,
        **{f"err_{k}": v for k, v in errs.items()},
    )
    rows.append(row)
    print(row, flush=True)


def bench(fn, ms: float) -> list[float]:
    return triton.testing.do_bench(fn, warmup=max(25, ms / 10), rep=ms, return_mode="all")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--kernel-ms", type=float, default=400)
    parser.add_argument("--step-ms", type=float, default=1500)
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS))
    parser.add_argument("--launch-once", metavar="VARIANT", help="one forward at the leaderboard shape (for ncu)")
    args = parser.parse_args()
    if args.launch_once:
        q, k, v = (torch.randn(1, 16, 16384, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        VARIANTS[args.launch_once]()
        out, lse = torch.empty_like(q), torch.empty(q.shape[:-1], device="cuda")
        forward_section, backward_section = heuristics.gluon_sections(16384, 64, 2, 16, True)
        G.launch_forward_gluon(q, k, v, out, lse, True, forward_section)
        G._backward(q[0], k[0], v[0], out[0], torch.randn_like(q[0]), lse[0], True, backward_section)
        torch.cuda.synchronize()
        return
    variants = args.variants
    rows: list[dict] = []
    device = torch.cuda.get_device_name()
    for variant in variants[1:]:
        for heads, n, d, causal in (
            (16, 16384, 64, True),
            (4, 16448, 64, True),
            (4, 16400, 64, True),
            (1, 65536, 64, True),
        ):
            check(variant, heads, n, d, causal, rows)

    # the backward alone (preprocess, fused kernel, dQ conversion) at the leaderboard shape
    q, k, v, do = (torch.randn(16, 16384, 64, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    out, lse = torch.empty_like(q), torch.empty(q.shape[:-1], device="cuda")
    forward_section, backward_section = heuristics.gluon_sections(16384, 64, 2, 16, True)
    G.launch_forward_gluon(q, k, v, out, lse, True, forward_section)
    for r, order in enumerate(round_orders(variants, args.rounds)):
        for name in order:
            VARIANTS[name]()
            times = bench(lambda: G._backward(q, k, v, out, do, lse, True, backward_section), args.kernel_ms)
            rows.append(
                dict(
                    kind="backward",
                    variant=name,
                    d=64,
                    round=r,
                    ms=statistics.median(times),
                    runs=len(times),
                    device=device,
                )
            )
            print(rows[-1], flush=True)
    q = k = v = do = out = lse = None  # frees them (a `del` would unbind names the timed lambda above reads)

    # the leaderboard step
    qkv = torch.randn(3, 16, 16384, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    q, k, v = qkv
    flash = torch.compile(FlashAttentionTriton.apply)

    def ours():
        flash(q, k, v, True).sum().backward()

    sdpa = implementation("sdpa_cudnn")

    def cudnn():
        with sdpa.context():
            sdpa.apply(q, k, v, True).sum().backward()

    ours()
    names = [*variants, "sdpa_cudnn"]
    for r, order in enumerate(round_orders(names, args.rounds)):
        for name in order:
            if name != "sdpa_cudnn":
                VARIANTS[name]()
            times = bench(cudnn if name == "sdpa_cudnn" else ours, args.step_ms)
            qkv.grad = None
            rows.append(
                dict(
                    kind="leaderboard",
                    variant=name,
                    d=64,
                    round=r,
                    ms=statistics.median(times),
                    runs=len(times),
                    device=device,
                )
            )
            print(rows[-1], flush=True)

    keys = sorted({k for row in rows for k in row})
    with open(args.out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)
    print("\nsummary (medians over rounds, ms; ratio to sdpa_cudnn of the same round):")
    for kind in ("backward", "leaderboard"):
        for d in (64, 128):
            sel = [r for r in rows if r["kind"] == kind and r["d"] == d]
            if not sel:
                continue
            base = {r["round"]: r["ms"] for r in sel if r["variant"] == "sdpa_cudnn"}
            for name in [*variants, "sdpa_cudnn"]:
                mine = [r for r in sel if r["variant"] == name]
                if not mine:
                    continue
                ratios = [r["ms"] / base[r["round"]] for r in mine] if base else [float("nan")]
                print(
                    f"{kind:15s} d={d:3d} {name:12s} {statistics.median([r['ms'] for r in mine]):.4f} ms  "
                    f"ratio {min(ratios):.3f}-{max(ratios):.3f}"
                )


if __name__ == "__main__":
    sys.exit(main())
