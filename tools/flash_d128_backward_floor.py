"""Where the fused Gluon backward starts to pay at head dimension 128: eager forward+backward and its device time
at small grids, with the backward's route as shipped against the fused backward at any size (its limits
`heuristics.D128_BWD_MIN_SEQ_LEN` and `D128_BWD_MIN_CTAS_PER_SM` lifted), SDPA-cuDNN beside, in rounds whose
order rotates. Both of our routes are launched by the C++ autograd node eagerly; the device time is a CUDA
graph's replay of one call (`measure_device_ms`). Writes every timing as CSV rows and prints the medians.

    python tools/flash_d128_backward_floor.py OUT.csv [--heads 1 2 4 8 16] [--seq-lens 4096 8192] [--rounds 3]

Run on a Hopper GPU; the results go to the tuning record (docs/flash_attention_tuning.md).
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from cs336_systems.attention import heuristics
from cs336_systems.attention.api import flash_attention_triton
from cs336_systems.attention.configs import forget_answers
from cs336_systems.attention.launch import dispatch
from cs336_systems.attention.launch.layout import head_views
from cs336_systems.benchmarking.timing import (
    TimingSettings,
    measure_device_ms,
    measure_times_ms,
    median_table,
    round_orders,
)

SETTINGS = TimingSettings(warmup_ms=20, rep_ms=60)
SHIPPED = (heuristics.D128_BWD_MIN_SEQ_LEN, heuristics.D128_BWD_MIN_CTAS_PER_SM)


def use_limits(name: str) -> None:
    """The fused backward's limits as shipped ("shipped") or lifted ("gluon_bwd"); the routes decided afresh."""
    heuristics.D128_BWD_MIN_SEQ_LEN, heuristics.D128_BWD_MIN_CTAS_PER_SM = SHIPPED if name == "shipped" else (0, 0)
    forget_answers()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--heads", type=int, nargs="*", default=[1, 2, 4, 8, 16])
    parser.add_argument("--seq-lens", type=int, nargs="*", default=[4096, 8192])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    device, rows = torch.device("cuda"), []
    for heads in args.heads:
        for n in args.seq_lens:
            for causal in (True, False):
                gen = torch.Generator(device="cuda").manual_seed(n + heads)
                q, k, v = (
                    head_views(
                        torch.randn(1, n, heads * 128, device="cuda", dtype=torch.bfloat16, generator=gen), heads
                    ).requires_grad_()
                    for _ in range(3)
                )
                grad_out = torch.randn(1, heads, n, 128, device="cuda", dtype=torch.bfloat16, generator=gen)

                def ours():
                    flash_attention_triton(q, k, v, causal).backward(grad_out)

                def cudnn():
                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                        F.scaled_dot_product_attention(q, k, v, is_causal=causal).backward(grad_out)

                impls = [("shipped", ours), ("gluon_bwd", ours), ("cudnn", cudnn)]
                for r, order in enumerate(round_orders(impls, args.rounds)):
                    for name, fn in order:
                        use_limits(name)
                        fused = dispatch.gluon_kernels(q, k, v, causal, False)[1]
                        for kind in ("eager", "device"):
                            times = (
                                measure_times_ms(fn, device, SETTINGS, (q, k, v))
                                if kind == "eager"
                                else measure_device_ms(fn, SETTINGS, (q, k, v))
                            )
                            rows.append(
                                dict(
                                    heads=heads,
                                    n=n,
                                    causal=causal,
                                    impl=name,
                                    gluon_bwd=fused,
                                    kind=kind,
                                    round=r,
                                    ms=statistics.median(times),
                                    device=torch.cuda.get_device_name(),
                                )
                            )
                use_limits("shipped")
                q = k = v = grad_out = None  # frees them (a `del` would unbind names ours() and cudnn() read)
                torch.cuda.empty_cache()
    median_table(
        rows, args.out, ["heads", "n", "causal", "kind", "impl"], "impl", [("shipped", "cudnn"), ("gluon_bwd", "cudnn")]
    )


if __name__ == "__main__":
    main()
