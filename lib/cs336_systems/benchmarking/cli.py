"""Command line: `python -m cs336_systems.benchmarking --size xl --context-length 512 ...` prints one row."""

from __future__ import annotations

import argparse
import json
import sys

import torch

from cs336_systems.benchmarking.harness import COMPILE_SCOPES, MODES, PRECISIONS, BenchmarkConfig, run_benchmark
from cs336_systems.optim import OPTIMIZERS


def _integer(least: int):
    """An argparse type: an int of at least `least` (0 or 1)."""

    def parse(value: str) -> int:
        try:
            if int(value) >= least:
                return int(value)
        except ValueError:
            pass
        raise argparse.ArgumentTypeError(f"must be a {'positive' if least else 'non-negative'} integer, got {value!r}")

    return parse


def _device(value: str) -> str:
    """An argparse type: cpu, or cuda[:index] of a GPU torch sees."""
    try:
        device = torch.device(value)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a device; use cpu or cuda") from None
    if device.type == "meta":
        raise argparse.ArgumentTypeError("meta tensors hold no data, so nothing would run to be timed; use cpu or cuda")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise argparse.ArgumentTypeError("cuda was asked for but torch sees no CUDA device; use cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise argparse.ArgumentTypeError(
                f"{value} is not one of the {torch.cuda.device_count()} CUDA devices torch sees"
            )
    elif device.type != "cpu":
        raise argparse.ArgumentTypeError(f"{value!r}: only cpu and cuda are benchmarked")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m cs336_systems.benchmarking", description=__doc__)
    p.add_argument("--size", default="small", help="model size name (small, medium, large, xl, 2.7B, nano, tiny, mini)")
    p.add_argument("--context-length", type=_integer(1), default=256)
    p.add_argument("--batch-size", type=_integer(1), default=4)
    p.add_argument("--mode", choices=MODES, default="forward-backward")
    p.add_argument("--precision", choices=PRECISIONS, default="fp32")
    p.add_argument("--warmup", type=_integer(0), default=5)
    p.add_argument("--steps", type=_integer(1), default=10)
    p.add_argument("--compile", action="store_true", help="wrap the model in torch.compile")
    p.add_argument(
        "--compile-scope",
        choices=COMPILE_SCOPES,
        default="model",
        help=(
            "with --compile: the whole model, or each repeated block "
            "(regional compilation, compiles in one block's time)"
        ),
    )
    p.add_argument("--attention", default="naive", help="naive, sdpa, flash_pytorch or flash_triton")
    p.add_argument(
        "--checkpoint-every", type=_integer(1), default=None, help="recompute activations in groups of k blocks"
    )
    p.add_argument(
        "--optimizer", choices=OPTIMIZERS, default="adamw", help="train-step only: which AdamW steps the model"
    )
    p.add_argument("--device", type=_device, default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--json", action="store_true", help="print the row as JSON instead of a table")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config = BenchmarkConfig(
        size=args.size,
        context_length=args.context_length,
        batch_size=args.batch_size,
        mode=args.mode,
        precision=args.precision,
        warmup=args.warmup,
        steps=args.steps,
        compile=args.compile,
        compile_scope=args.compile_scope,
        attention=args.attention,
        checkpoint_every=args.checkpoint_every,
        optimizer=args.optimizer,
        device=args.device,
    )
    try:
        row = run_benchmark(config)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(row, default=str))
        return 0
    keys = [
        "size",
        "context_length",
        "batch_size",
        "mode",
        "precision",
        "compile",
        "attention",
        "optimizer",
        "parameters",
        "status",
        "mean_ms",
        "std_ms",
        "median_ms",
        "peak_memory_mib",
    ]
    width = max(map(len, keys))
    for k in keys:
        v = row.get(k, "")
        print(f"{k:<{width}}  {v:.3f}" if isinstance(v, float) else f"{k:<{width}}  {v}")
    return 0 if row["status"] == "ok" else 1
