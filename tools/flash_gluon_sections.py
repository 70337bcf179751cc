"""The Gluon kernels' CTA order, A/B: each head's blocks one head after another (SECTION = 1, the (block, batch)
grids the kernels had before sections) against heaviest first in sections of heads that fit in L2 (the SECTION
`heuristics.heads_per_section` picks; `flash_gluon_schedule`), for the forward kernel and the fused
backward kernel alone, in the model's layout. Checks first that both orders give the same O and L, dK and dV
bit for bit and dQ to fp32 rounding (its parts are added in another order), then times each kernel's device
time (one launch replayed as a CUDA graph, `measure_device_ms`) in rounds whose order alternates. Writes
every timing as CSV rows and prints the medians.

    python tools/flash_gluon_sections.py OUT.csv [--rounds 3] [--shapes 64x4096x128 ...] [--sections 1 0]
        [--causal-only]

A shape is heads x N x d, run causal and full (d = 64: causal, the only backward it has). `--sections` lists
the orders to time: heads per section, 0 for the launch's own choice (sections larger than the batch are
skipped). Run on a Hopper GPU; the results go to the tuning record (docs/flash_attention_tuning.md, the CTAs' order).
"""

from __future__ import annotations

import argparse
import statistics

import pandas as pd
import torch

from cs336_systems.attention import heuristics
from cs336_systems.attention.launch import gluon as flash_gluon
from cs336_systems.attention.launch.layout import head_views
from cs336_systems.benchmarking.timing import TimingSettings, measure_device_ms, median_table, round_orders

SETTINGS = TimingSettings(warmup_ms=20, rep_ms=100)
SHAPES = [
    "4x4096x128",
    "4x8192x128",
    "16x4096x128",
    "16x8192x128",
    "64x4096x128",
    "64x8192x128",
    "32x32768x128",
    "16x16384x64",
]


def with_section(launch: flash_gluon.KernelLaunch, section: int | None, batch: int) -> flash_gluon.KernelLaunch:
    """The launch of `batch` heads in the order of `section` heads per section (None: the library's choice)."""
    return launch if section is None else flash_gluon.with_section(launch, section, batch)


def problem(heads: int, n: int, d: int, causal: bool) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(n + heads + d)
    q, k, v, do = (
        head_views(torch.randn(1, n, heads * d, device="cuda", dtype=torch.bfloat16, generator=gen), heads)
        for _ in range(4)
    )
    out = torch.empty(q.shape, device="cuda", dtype=q.dtype)
    lse = torch.empty(q.shape[:-1], device="cuda")
    delta, dq_acc = torch.empty_like(lse), torch.empty(heads, n, d, device="cuda")
    grad_k, grad_v = torch.empty_like(k), torch.empty_like(v)
    sections = heuristics.gluon_sections(n, d, q.element_size(), heads, causal)
    forward = flash_gluon.forward_launch(q, k, v, out, lse, causal, sections[0])
    forward.run()
    preprocess = flash_gluon.preprocess_launch(out, do, delta, dq_acc)
    backward = flash_gluon.backward_launch(q, k, v, do, lse, delta, grad_k, grad_v, dq_acc, causal, sections[1])
    return dict(
        forward=forward,
        preprocess=preprocess,
        backward=backward,
        out=out,
        lse=lse,
        dq_acc=dq_acc,
        grad_k=grad_k,
        grad_v=grad_v,
        heads=heads,
    )


def results(p: dict, section: int | None) -> list[torch.Tensor]:
    with_section(p["forward"], section, p["heads"]).run()
    p["preprocess"].run()
    with_section(p["backward"], section, p["heads"]).run()
    return [t.clone() for t in (p["out"], p["lse"], p["grad_k"], p["grad_v"], p["dq_acc"])]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shapes", nargs="*", default=SHAPES)
    parser.add_argument("--sections", type=int, nargs="*", default=[1, 0])
    parser.add_argument("--causal-only", action="store_true")
    args = parser.parse_args()
    rows = []
    for shape in args.shapes:
        heads, n, d = (int(x) for x in shape.split("x"))
        for causal in (True, False) if d == 128 else (True,):
            if args.causal_only and not causal:
                continue
            p = problem(heads, n, d, causal)
            chosen = {"forward": p["forward"].options["SECTION"], "backward": p["backward"].options["SECTION"]}
            orders = [
                (f"section_{s}" if s else "chosen", s or None)
                for s in args.sections
                if s <= 1 << (heads - 1).bit_length()
            ]
            first = results(p, 1)
            for _, section in orders:
                other = results(p, section)
                for name, x, y in zip(("O", "L", "dK", "dV"), first, other):
                    assert torch.equal(x, y), f"{shape} causal={causal} section {section}: {name} differs"
                scale = first[-1].abs().max().item()
                assert (first[-1] - other[-1]).abs().max().item() <= 1e-5 * scale, f"{shape}: dQ differs"
            for kernel in ("forward", "backward"):
                for r, order in enumerate(round_orders(orders, args.rounds)):
                    for name, section in order:
                        launch = with_section(p[kernel], section, heads)
                        ms = statistics.median(measure_device_ms(launch.run, SETTINGS))
                        rows.append(
                            dict(
                                heads=heads,
                                n=n,
                                d=d,
                                causal=causal,
                                kernel=kernel,
                                order=name,
                                section=section or chosen[kernel],
                                round=r,
                                ms=ms,
                                device=torch.cuda.get_device_name(),
                            )
                        )
            del p
            torch.cuda.empty_cache()
            df = pd.DataFrame(rows)
            print(
                df[(df.heads == heads) & (df.n == n) & (df.d == d) & (df.causal == causal)]
                .groupby(["kernel", "order", "section"])
                .ms.median()
                .round(4)
                .to_string(),
                flush=True,
            )
    first = f"section_{args.sections[0]}" if args.sections[0] else "chosen"
    others = sorted({row["order"] for row in rows} - {first})
    median_table(
        rows,
        args.out,
        ["heads", "n", "d", "causal", "kernel", "order"],
        "order",
        [(name, first) for name in others],
        digits=4,
    )


if __name__ == "__main__":
    main()
