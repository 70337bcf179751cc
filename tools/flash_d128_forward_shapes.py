"""The forward at head dimension 128 across batch·heads and N, against SDPA's cuDNN and flash backends.

For each layout (a model's (1, h, N, d) views of its (1, N, h d) projections, and contiguous (1, h, N, d)
tensors), h in 1, 4, 16, 64 heads, N from 4,096 to 32,768, causal and full, bf16: the eager forward of inputs
that require gradients (as in training: the call also records its autograd node) and its device time (the
kernels of one call replayed as a CUDA graph, `measure_device_ms`), in rounds whose order rotates. Prints
each point's ratios to cuDNN and writes every timing as CSV rows.

    python tools/flash_d128_forward_shapes.py OUT.csv [--rounds 2] [--heads 1 4 16 64] [--seq-lens 4096 ...]
        [--layouts projections heads] [--gluon-from N] [--gluon-min-ctas C] [--gluon-min-batch B]

`--gluon-from N` lets the Gluon forward run from N on at d = 128 (`heuristics.MIN_SEQ_LEN`), its other limits
unchanged; `--gluon-min-ctas C` its floor of CTAs per SM at d = 128 (`heuristics.MIN_CTAS_PER_SM`), `--gluon-min-batch
B` its floor of batch·heads at d = 128, causal or not (`heuristics.MIN_BATCH`; both at 0: the Gluon forward at any
grid from `--gluon-from` on).

Run on a GPU; the results go to the tuning record (docs/flash_attention_tuning.md).
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from cs336_systems.attention import heuristics
from cs336_systems.attention.api import flash_attention_triton
from cs336_systems.attention.launch.layout import head_views
from cs336_systems.benchmarking.timing import (
    TimingSettings,
    measure_device_ms,
    measure_times_ms,
    median_table,
    round_orders,
)

SETTINGS = TimingSettings(warmup_ms=20, rep_ms=60)
BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "sdpa_flash": SDPBackend.FLASH_ATTENTION}


def inputs(layout: str, heads: int, n: int, d: int = 128) -> list[torch.Tensor]:
    gen = torch.Generator(device="cuda").manual_seed(n + heads)
    if layout == "projections":
        return [
            head_views(
                torch.randn(1, n, heads * d, device="cuda", dtype=torch.bfloat16, generator=gen), heads
            ).requires_grad_()
            for _ in range(3)
        ]
    return [
        torch.randn(1, heads, n, d, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
        for _ in range(3)
    ]


def forwards(q, k, v, causal: bool) -> dict:
    def sdpa(backend):
        def run():
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        return run

    return {"ours": lambda: flash_attention_triton(q, k, v, causal), **{n: sdpa(b) for n, b in BACKENDS.items()}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--heads", type=int, nargs="*", default=[1, 4, 16, 64])
    parser.add_argument("--seq-lens", type=int, nargs="*", default=[4096, 8192, 16384, 32768])
    parser.add_argument("--layouts", nargs="*", default=["projections", "heads"])
    parser.add_argument("--gluon-from", type=int, default=None)
    parser.add_argument("--gluon-min-ctas", type=float, default=None)
    parser.add_argument("--gluon-min-batch", type=int, default=None)
    args = parser.parse_args()
    if args.gluon_min_ctas is not None:
        heuristics.MIN_CTAS_PER_SM = {**heuristics.MIN_CTAS_PER_SM, 128: args.gluon_min_ctas}
    if args.gluon_min_batch is not None:
        heuristics.MIN_BATCH = {**heuristics.MIN_BATCH, 128: {True: args.gluon_min_batch, False: args.gluon_min_batch}}
    if args.gluon_from is not None:
        heuristics.MIN_SEQ_LEN = {**heuristics.MIN_SEQ_LEN, 128: args.gluon_from}
    rows = []
    device = torch.device("cuda")
    for layout in args.layouts:
        for heads in args.heads:
            for n in args.seq_lens:
                for causal in (True, False):
                    q, k, v = inputs(layout, heads, n)
                    fns = forwards(q, k, v, causal)
                    names = list(fns)
                    for r, order in enumerate(round_orders(names, args.rounds)):
                        for name in order:
                            for kind, times in (
                                ("eager", measure_times_ms(fns[name], device, SETTINGS)),
                                ("device", measure_device_ms(fns[name], SETTINGS)),
                            ):
                                rows.append(
                                    dict(
                                        layout=layout,
                                        heads=heads,
                                        seq_len=n,
                                        causal=causal,
                                        impl=name,
                                        kind=kind,
                                        round=r,
                                        ms=statistics.median(times),
                                        gluon_from=heuristics.MIN_SEQ_LEN[128],
                                        gluon_min_ctas=heuristics.MIN_CTAS_PER_SM[128],
                                        gluon_min_batch=str(heuristics.MIN_BATCH[128]),
                                        device=torch.cuda.get_device_name(),
                                    )
                                )
                    del q, k, v, fns
                    torch.cuda.empty_cache()
    median_table(
        rows,
        args.out,
        ["layout", "heads", "seq_len", "causal", "kind", "impl"],
        "impl",
        [("ours", "cudnn"), ("ours", "sdpa_flash")],
    )


if __name__ == "__main__":
    main()
