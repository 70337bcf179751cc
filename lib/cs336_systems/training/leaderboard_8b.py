"""Time the spring-2026 leaderboard's training step: the 8B TransformerLM (vocab 151,936, d_model 4,096,
d_ff 11,008, 34 layers, 32 heads, context 32,768, bf16, causal), random tokens, batch 1 per GPU by
default (`--batch`).

    python -m cs336_systems.training.leaderboard_8b [--layers N] [--context T] [--rep MS] [--warmup MS]
                                                    [--variant ours|torch_native] [--state-dtype fp32|bf16] [--batch B]
                                                    [--trace PATH.json.gz] [--memory-gib G] [--no-offload-states]

prints what the handout's test measures, `triton.testing.do_bench(step, rep=30_000, warmup=10_000)`
(its mean, in ms), the peak CUDA memory, the useful TFLOP/s (`useful_flops`), the time from process
start to the first timed step, and each GPU's SM clock and power while the steps were timed (at the board's
power limit the clock, not only the cycles, sets the time; `GpuTelemetry`). `--variant ours` is
`build_train_step` (flash_triton attention, the recompute plan, fused loss, FusedAdamW); `torch_native` is
`torch_native_step` (SDPA, every block checkpointed, full logits, torch.optim.AdamW(fused=True)).

Set `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` in the environment (notebook 20 and
`torchrun_step` do): the plan fills the GPU to a 5 GiB margin, and with fixed-size segments the caching
allocator can strand several GiB in fragments and run out of memory. `--state-dtype` defaults to bf16,
the states the record chose. CUDA only: it exits with a clear message elsewhere. Under
`torchrun --nproc-per-node N` the same command runs the step data parallel (`TrainStep`: gradients and
AdamW states sharded over the ranks, each bucket of gradients reduced to its owner overlapping the
backward), batch `--batch` per GPU, each rank its own random tokens; the handout's test is batch 2 on two
GPUs: `--batch 1` on 2 ranks. There every rank times the step with do_bench's algorithm and the same
number of calls (`do_bench_agreed`: each rank's own estimate could round to one call more, and that rank
would wait in a collective until the timeout). Each step's parameter exchange completes in the next step's
forward, each block waiting for its own parameters (`--no-exchange-in-forward`: at the end of the step).
AdamW's states wait in pinned host memory through the forward, copied out as it starts and back during the
backward, so that the recompute plan gives their GPU memory to saved activations (`--no-offload-states`: they
stay on the GPU).
With `--json PATH` the result goes there too; a step whose plan cannot fit writes its refusal there (`status`
"does not fit", the least need and the budget in GiB, and `would_fit`: `PlanDoesNotFit.would_fit`) and exits 1.
`--trace PATH` profiles two more steps after the timing (torch.profiler, CPU and CUDA), the second in a
`TRACED_STEP` range, and writes rank 0's Chrome trace there (gzipped for a `.gz` name): the compute and
communication streams of a step as it runs in the timed loop.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import UTC, datetime

import torch
import torch.distributed as dist

from cs336_systems.benchmarking.agreed_bench import do_bench_agreed
from cs336_systems.benchmarking.gpu_telemetry import GpuTelemetry
from cs336_systems.model import TransformerLM
from cs336_systems.training.config import StepConfig
from cs336_systems.training.memory_plan import PlanDoesNotFit
from cs336_systems.training.step import build_train_step, torch_native_step

# The handout's configuration.
VOCAB, D_MODEL, D_FF, LAYERS, HEADS, CONTEXT = 151_936, 4_096, 11_008, 34, 32, 32_768
# The compiled blocks' partitioner budget of our step (StepConfig.activation_memory_budget), chosen by
# measuring one 8B block at this context (docs/leaderboard_8b_record.md, tools/activation_budget_probe.py)
ACTIVATION_MEMORY_BUDGET = 0.6
# The profiler range around the step `--trace` profiles (`trace_step`).
TRACED_STEP = "traced step"


def utc_minute() -> str:
    """Now, as the command tables' `date` column writes it: year-month-day hour:minute, then UTC."""
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")


def process_start_time() -> float:
    """time.time() at process start (psutil if present, else this module's import time)."""
    try:
        import psutil

        return psutil.Process().create_time()
    except ImportError:
        return IMPORT_TIME


IMPORT_TIME = time.time()


def useful_flops(matmul_params: int, layers: int, tokens: int, context: int, d_model: int = D_MODEL) -> float:
    """Model FLOPs of one step (no recomputation counted):
    6 * matmul_params * tokens (forward 2 + backward 4 per weight and token; matmul_params = all
    parameters but the token embedding, a lookup: 7.503e9 of the 8.126e9)
    + 7 * layers * tokens * context * d_model (causal attention: the forward's two products,
    2 * 2 * T^2 * d_model / 2 per sequence and layer, and a backward of 2.5 times that). At batch 1,
    34 layers, T = 32,768: 1.475e15 + 1.047e15 = 2.522e15."""
    return 6.0 * matmul_params * tokens + 7.0 * layers * tokens * context * d_model


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=LAYERS)
    p.add_argument("--context", type=int, default=CONTEXT)
    p.add_argument("--rep", type=int, default=30_000, help="do_bench rep (ms)")
    p.add_argument("--warmup", type=int, default=10_000, help="do_bench warmup (ms)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--variant", choices=("ours", "torch_native"), default="ours")
    p.add_argument("--state-dtype", choices=("fp32", "bf16"), default="bf16")
    p.add_argument("--recompute", choices=("plan", "all", "none"), default="plan")
    p.add_argument(
        "--keep-attention",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="ours: recomputed blocks keep attention's output (selective recompute)",
    )
    p.add_argument(
        "--activation-memory-budget",
        type=float,
        default=None,
        help=f"ours, compiled: the partitioner's budget (default {ACTIVATION_MEMORY_BUDGET}; 1 saves all)",
    )
    p.add_argument(
        "--exchange-in-forward",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="ours, data parallel: each step's parameter exchange completes in the next forward, block by block "
        "(StepConfig.exchange_in_forward); --no-exchange-in-forward: at the end of its own step",
    )
    p.add_argument(
        "--offload-states",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="ours: AdamW's states in pinned host memory through the forward, their GPU memory given to the forward's "
        "activations (StepConfig.offload_optimizer_states; the default); --no-offload-states: kept on the GPU",
    )
    p.add_argument("--compile-blocks", action="store_true", help="torch.compile each block (either variant)")
    p.add_argument(
        "--memory-gib",
        type=float,
        default=None,
        help="cap this process at this many GiB of the card (set_per_process_memory_fraction; "
        "the plan's budget honours it): a smaller card simulated on a larger one",
    )
    p.add_argument("--json", default=None, help="also write rank 0's result to this JSON file")
    p.add_argument(
        "--trace",
        default=None,
        help="profile two more steps (the second as a timed one runs); rank 0's Chrome trace to this path",
    )
    return p.parse_args(argv)


def main(argv=None) -> dict | None:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("leaderboard_8b: needs a CUDA GPU (the 8B step is timed with CUDA events by do_bench)")
    if args.batch < 1 or args.layers < 1 or not 1 <= args.context <= CONTEXT:
        sys.exit(f"leaderboard_8b: --batch and --layers must be >= 1 and --context in [1, {CONTEXT}]")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:  # under torchrun: one process per GPU, the step data parallel (TrainStep)
        from cs336_systems.distributed import launch_from_env

        if world > torch.cuda.device_count() and "LOCAL_WORLD_SIZE" not in os.environ:
            sys.exit(f"leaderboard_8b: WORLD_SIZE={world} but this machine has {torch.cuda.device_count()} GPU(s)")
        return launch_from_env(timed_step, (args,), backend="nccl")
    return timed_step(None, args)


def trace_step(step_obj, x: torch.Tensor, y: torch.Tensor, path: str | None) -> None:
    """Two more steps under torch.profiler (CPU and CUDA activity), the second inside a `TRACED_STEP` range:
    it runs as a timed step does, the first one's parameter exchange in flight into its forward. Rank 0's
    Chrome trace written to `path` (every rank steps, since the step's collectives need them all; only a rank
    with a path profiles)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    if path is None:
        for _ in range(2):
            step_obj.step(x, y)
        torch.cuda.synchronize()
        return
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step_obj.step(x, y)
        with record_function(TRACED_STEP):
            step_obj.step(x, y)
        torch.cuda.synchronize()
    prof.export_chrome_trace(path)


def timed_step(ctx, args: argparse.Namespace) -> dict:
    """Build the model and the step on this rank's GPU (rank 0's weights everywhere; each rank its own
    random batch), time it with do_bench, and print the result on rank 0. `ctx` is the `DistContext` under
    torchrun, None on one GPU."""
    import triton.testing

    start = process_start_time()
    rank, world = (ctx.rank, ctx.world_size) if ctx is not None else (0, 1)
    # an indexed device: torch.cuda.set_device refuses a bare "cuda"
    device = ctx.device if ctx is not None else torch.device("cuda", torch.cuda.current_device())
    torch.cuda.set_device(device)
    if args.memory_gib is not None:
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.memory_gib * 2**30 / total), device)
    torch.manual_seed(0)
    attention = "flash_triton" if args.variant == "ours" else "sdpa"
    model = TransformerLM(
        VOCAB, args.context, D_MODEL, args.layers, HEADS, D_FF, attention=attention, device=device, dtype=torch.bfloat16
    )
    n_params = sum(p.numel() for p in model.parameters())
    matmul_params = n_params - model.token_embeddings.weight.numel()
    if args.variant == "ours":
        config = StepConfig(
            lr=1e-4,
            state_dtype=torch.float32 if args.state_dtype == "fp32" else torch.bfloat16,
            recompute=args.recompute,
            compile_blocks=args.compile_blocks,
            keep_attention=args.keep_attention,
            exchange_in_forward=args.exchange_in_forward,
            offload_optimizer_states=args.offload_states,
            activation_memory_budget=(args.activation_memory_budget or ACTIVATION_MEMORY_BUDGET)
            if args.compile_blocks
            else None,
        )
        step_obj = build_train_step(model, config)
    else:
        step_obj = torch_native_step(model, lr=1e-4, compile_blocks=args.compile_blocks)
    gen = torch.Generator(device=device).manual_seed(1 + rank)
    x = torch.randint(0, VOCAB, (args.batch, args.context), device=device, generator=gen)
    y = torch.randint(0, VOCAB, (args.batch, args.context), device=device, generator=gen)

    calls: list[float] = []

    def train_step():
        calls.append(time.time())
        step_obj.step(x, y)

    run = dict(
        variant=args.variant,
        batch=args.batch,
        world_size=world,
        layers=args.layers,
        context=args.context,
        params=n_params,
    )
    if args.variant == "ours":
        try:  # the plan is made here rather than inside the timing, so a step that cannot fit says what would
            step_obj.plan_for(x)
        except PlanDoesNotFit as err:
            if args.json and rank == 0:  # the refusal as a result: what it needed, what it had, what would fit
                refusal = dict(
                    run,
                    memory_gib=args.memory_gib,
                    states_offloaded=args.offload_states,
                    status="does not fit",
                    note=str(err),
                    need_gib=err.need_bytes / 2**30,
                    budget_gib=err.budget_bytes / 2**30,
                    would_fit=err.would_fit,
                    device=torch.cuda.get_device_name(device),
                    date=utc_minute(),
                )
                with open(args.json, "w") as f:
                    json.dump(refusal, f, indent=1)
            sys.exit(f"leaderboard_8b: {err}")
        except ValueError as err:
            sys.exit(f"leaderboard_8b: {err}")
    torch.cuda.reset_peak_memory_stats()
    with GpuTelemetry(device, interval_ms=200) as telemetry:  # the clock the power cap leaves this GPU
        if world > 1:
            ms = do_bench_agreed(train_step, warmup=args.warmup, rep=args.rep)
        else:
            ms = triton.testing.do_bench(train_step, rep=args.rep, warmup=args.warmup)
        timed_end = time.time()
    peak = torch.cuda.max_memory_allocated()
    if args.trace:  # the traced step's forward overlaps the last timed step's exchange, as every timed one did
        trace_step(step_obj, x, y, args.trace if rank == 0 else None)
    step_obj.wait_for_exchange()
    # do_bench calls fn once, 5 times to estimate, n_warmup times, then n_repeat timed times with
    # n_warmup : n_repeat = warmup : rep (up to rounding): the first timed call is about this one.
    extra = len(calls) - 6
    first_timed = 6 + round(extra * args.warmup / (args.warmup + args.rep)) if extra > 0 else len(calls) - 1
    to_first_timed = calls[min(first_timed, len(calls) - 1)] - start
    clocks = telemetry.window(calls[min(first_timed, len(calls) - 1)], timed_end)
    if world > 1:  # every rank's GPU: the slowest clock sets a data-parallel step's pace
        every = [None] * world
        dist.all_gather_object(every, clocks)
    else:
        every = [clocks]
    plan = getattr(step_obj, "plans", {}).get((args.batch, args.context))
    flops = useful_flops(matmul_params, args.layers, args.batch * args.context, args.context)
    result = dict(
        run,
        ms=ms,
        rep_ms=args.rep,
        warmup_ms=args.warmup,
        peak_gib=peak / 2**30,
        memory_gib=args.memory_gib,
        useful_tflops=flops / (ms * 1e-3) / 1e12,
        seconds_to_first_timed_step=to_first_timed,
        plan=list(plan.recompute) if plan is not None else None,
        attention_kept=bool(plan is not None and plan.keep_attention),
        states_offloaded=bool(args.variant == "ours" and args.offload_states),
        fetch_states_at=plan.fetch_states_at if plan is not None else None,
        # each GPU's median SM clock (MHz) and power (W) over the timed steps, and its share of samples at the
        # power cap (`GpuTelemetry`; NaN without nvidia-smi)
        sm_mhz_by_gpu=[c["sm_mhz"] for c in every],
        power_w_by_gpu=[c["power_w"] for c in every],
        power_capped_by_gpu=[c["power_capped"] for c in every],
    )
    if rank == 0:
        print(
            f"variant {args.variant}: batch {args.batch} per GPU on {world} GPU(s), {args.layers} layers, "
            f"context {args.context}, {n_params / 1e9:.2f}B parameters"
        )
        if result["plan"] is not None:
            kept = ", each keeping its attention output" if result["attention_kept"] else ""
            print(f"recompute plan: {sum(result['plan'])} of {args.layers} blocks recomputed (the first ones{kept})")
        if result["fetch_states_at"] is not None:
            fetch = result["fetch_states_at"]
            print(
                f"optimizer states: in host memory through the forward, fetched back at block {fetch}'s output gradient"
            )
        print(f"do_bench(train_step, rep={args.rep}, warmup={args.warmup}): {ms:.1f} ms per step")
        print(f"peak memory (rank 0): {result['peak_gib']:.2f} GiB")
        print(f"useful: {flops:.4g} FLOPs/step per GPU, {result['useful_tflops']:.1f} TFLOP/s per GPU")
        print(f"process start to the first timed step: {to_first_timed:.1f} s (approximate: do_bench's call count)")
        print(
            "while timed, per GPU: SM clock "
            + ", ".join(f"{c['sm_mhz']:.0f}" for c in every)
            + " MHz (median); power "
            + ", ".join(f"{c['power_w']:.0f}" for c in every)
            + " W; at the power cap "
            + ", ".join(f"{c['power_capped']:.0%}" for c in every)
            + " of the samples"
        )
        if args.json:
            with open(args.json, "w") as f:
                json.dump(dict(result, device=torch.cuda.get_device_name(device), date=utc_minute()), f, indent=1)
    return result


if __name__ == "__main__":
    main()
