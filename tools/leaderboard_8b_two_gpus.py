"""The spring-2026 leaderboard's own setting: the 8B step on two GPUs, batch 2 (one sequence per GPU), timed
by the handout's command, beside the one-GPU batch-1 step of the same code on the same host and the
torch-native step on the same two GPUs; then one two-GPU step profiled (compute and communication streams).

    PYTHONPATH=lib python tools/leaderboard_8b_two_gpus.py --out DIR [--layers 34] [--rep 30000] [--warmup 10000]
                                                          [--commit SHA] [--no-offload-states] [--one-gpu]
    PYTHONPATH=lib python tools/leaderboard_8b_two_gpus.py --out DIR --append-json RESULT.json [--empty-caches]
                                                          [--commit SHA]


Each command runs from empty Triton and Inductor caches (`torchrun_step(cold_cache=True)`), in this order:
ours on two GPUs (with `--trace`), ours on one GPU, torch-native on two; ours keeps AdamW's states in host
memory through the forward, as the command does by default (`--no-offload-states`: on the GPU). DIR receives
`leaderboard_8b_two_gpus_command.csv` (the schema of `reports/gpu/results/leaderboard_8b_command.csv`
plus `blocks_recomputed`, `memory_cap_gib`, `sm_mhz` (the slowest GPU's median SM clock while timed),
`power_capped` (the largest share of its samples a GPU spent at the power cap), `commit`, `wall_s`, `status`
and `note`), and from the trace
`leaderboard_8b_two_gpus_streams.csv` (`two_gpu_profile`: `stream_summary`), `leaderboard_8b_two_gpus_overlap.csv`
(`communication_overlap`), a timeline figure and the gzipped trace itself. `--from-trace TRACE` rebuilds only
those from a trace (no GPU needed). `--append-json RESULT` adds one `leaderboard_8b --json RESULT` run made by
hand (for instance under `--memory-gib 78`, an 80 GB card simulated on a larger one; its cap is read from the
result) to the rows already in DIR's table.

`--one-gpu` runs the command on one GPU instead (`one_gpu_runs`): ours on the whole model, and where its memory
plan refuses it (an 80 GB card), ours on the most layers the refusal names; then the torch-native step on the
layers ours ran. Its rows, a refusal's included (`need_gib`, `budget_gib`, `fits_layers`), go to DIR's
`leaderboard_8b_one_gpu_command.csv`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

import pandas as pd
import torch

from cs336_systems.benchmarking.gpu_telemetry import RUN_SUMMARIES, across_gpus
from cs336_systems.experiments.leaderboard_8b_record import torchrun_step, two_gpu_profile
from cs336_systems.training.leaderboard_8b import LAYERS, utc_minute

RUNS = (("ours", 2), ("ours", 1), ("torch_native", 2))  # the bar's two steps first, the baseline last
COMMAND_COLUMNS = [
    "command",
    "variant",
    "batch",
    "world_size",
    "layers",
    "context",
    "params",
    "ms",
    "peak_gib",
    "useful_tflops",
    "seconds_to_first_timed_step",
    "attention_kept",
    "device",
    "vs_torch_native",
    "blocks_recomputed",
    "memory_cap_gib",
    "need_gib",
    "budget_gib",
    "fits_layers",
    "sm_mhz",
    "power_capped",
    "commit",
    "date",
    "wall_s",
    "status",
    "note",
]


def command_rows(results: list[dict], rep: int, warmup: int, commit: str, empty_caches: bool = True) -> pd.DataFrame:
    """The runs as rows of the command table: the command each was (with its `memory_gib` cap and
    `--offload-states`, where a result has them, and whether its compile caches were empty), and its time
    against the torch-native step of the same world size among `results` (NaN where that one did not run)."""
    df = pd.DataFrame(results)
    for column in COMMAND_COLUMNS + ["memory_gib"]:
        if column not in df:
            df[column] = None
    launcher = df.world_size.map(lambda n: f"torchrun --nproc-per-node {int(n)} -m" if n > 1 else "python -m")
    caches = "empty caches" if empty_caches else "compile caches as the machine had them"
    if df["date"].isna().all():  # when the runs ended; the report leads with runs after the notebook's own
        df["date"] = utc_minute()
    offloaded = df["states_offloaded"] if "states_offloaded" in df else pd.Series(None, index=df.index)
    layers = [f" --layers {int(n)}" if pd.notna(n) and int(n) != LAYERS else "" for n in df.layers]
    df["command"] = [
        f"{lf} cs336_systems.training.leaderboard_8b --compile-blocks --variant {v}{n}"
        + (f" --memory-gib {cap:g}" if pd.notna(cap) else "")
        + ("" if v != "ours" or pd.isna(off) else " --offload-states" if bool(off) else " --no-offload-states")
        + f" (rep {rep}, warmup {warmup}, {caches}, expandable segments, commit {commit})"
        for lf, v, n, cap, off in zip(launcher, df.variant, layers, df.memory_gib, offloaded)
    ]
    df["fits_layers"] = [
        w.get("layers") if isinstance(w, dict) else None for w in df.get("would_fit", [None] * len(df))
    ]
    df["commit"] = commit
    df["memory_cap_gib"] = df.memory_gib
    df["blocks_recomputed"] = (
        [sum(plan) if isinstance(plan, list) else None for plan in df["plan"]] if "plan" in df else None
    )  # ours' recompute plan on rank 0 (torch-native recomputes every block)
    # the slowest GPU's median SM clock while timed (it sets a data-parallel step's pace), and the largest
    # share of samples at the power cap among the GPUs
    for column, name, how in RUN_SUMMARIES:
        df[name] = [across_gpus(v, how) for v in (df[column] if column in df else [None] * len(df))]
    native = df[(df.variant == "torch_native") & (df.status == "ok")].set_index(["world_size", "layers"]).ms
    df["vs_torch_native"] = [
        ms / native[key] if key in native.index and status == "ok" else float("nan")
        for ms, key, status in zip(df.ms, zip(df.world_size, df.layers), df.status)
    ]
    return df[COMMAND_COLUMNS]


def append_result(table: Path, result: dict, commit: str, empty_caches: bool) -> pd.DataFrame:
    """`table` (the command table, if it exists) with one more row: a `leaderboard_8b --json` result, run from
    empty compile caches (a fresh machine) or not. Its ratio to the torch-native step stays empty: no
    torch-native step ran beside it."""
    row = command_rows(
        [dict(result, status="ok", note="")], result["rep_ms"], result["warmup_ms"], commit, empty_caches
    )
    if not table.exists():
        return row
    earlier = pd.read_csv(table, dtype={"commit": str})  # a hash of digits and one "e" would read as a float
    return pd.concat([earlier.reindex(columns=COMMAND_COLUMNS), row], ignore_index=True)


def stream_tables(trace: Path, out: Path) -> None:
    """The traced step's per-stream summary, its communication overlap and its timeline, into `out`."""
    import matplotlib

    matplotlib.use("Agg")
    streams, overlap, fig = two_gpu_profile(trace)
    streams.to_csv(out / "leaderboard_8b_two_gpus_streams.csv", index=False)
    overlap.to_csv(out / "leaderboard_8b_two_gpus_overlap.csv", index=False)
    fig.savefig(out / "leaderboard_8b_two_gpus_timeline.png", dpi=110)


def run_logged(
    results: list[dict], table: Path, args, commit: str, variant: str, nproc: int, layers: int, **kw
) -> dict:
    """One command (`torchrun_step` from empty caches), its row added to `results` and the table rewritten
    (a later failure keeps it); the row named with this machine's GPU where the command died before saying."""
    row = torchrun_step(
        variant,
        nproc,
        layers=layers,
        context=args.context,
        rep_ms=args.rep,
        warmup_ms=args.warmup,
        compile_blocks=True,
        timeout_s=args.timeout,
        cold_cache=True,
        offload_states=args.offload_states,
        **kw,
    )
    row = dict(row, variant=variant, world_size=nproc, layers=layers)
    if not row.get("device") and torch.cuda.is_available():
        row["device"] = torch.cuda.get_device_name(0)
    results.append(row)
    print(
        f"{variant} on {nproc} GPU(s), {layers} layers: {row['status']}, {row.get('ms', float('nan')):.1f} ms, "
        f"{row['wall_s']:.0f} s {row['note']}",
        flush=True,
    )
    command_rows(results, args.rep, args.warmup, commit).to_csv(table, index=False)
    return row


def one_gpu_runs(args, commit: str) -> None:
    """The command on one GPU of this machine: ours on `--layers`; where its plan refuses them, ours again on
    the most layers the refusal says would fit; then the torch-native step on the layers ours ran."""
    table = args.out / "leaderboard_8b_one_gpu_command.csv"
    results: list[dict] = []
    ours = run_logged(results, table, args, commit, "ours", 1, args.layers)
    layers = args.layers
    if ours["status"] == "does not fit" and ours.get("would_fit", {}).get("layers"):
        layers = int(ours["would_fit"]["layers"])
        run_logged(results, table, args, commit, "ours", 1, layers)
    run_logged(results, table, args, commit, "torch_native", 1, layers)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--layers", type=int, default=LAYERS)
    p.add_argument("--context", type=int, default=32_768)
    p.add_argument("--rep", type=int, default=30_000)
    p.add_argument("--warmup", type=int, default=10_000)
    p.add_argument("--timeout", type=float, default=420.0, help="seconds per command")
    p.add_argument("--commit", default=None, help="the commit named in the rows (default: git's HEAD)")
    p.add_argument("--from-trace", type=Path, default=None, help="only the stream tables and figure of this trace")
    p.add_argument("--append-json", type=Path, default=None, help="add this `leaderboard_8b --json` result as a row")
    p.add_argument("--empty-caches", action="store_true", help="with --append-json: that run began with empty caches")
    p.add_argument(
        "--offload-states",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="our step's runs with AdamW's states in host memory (the command's default) or on the GPU",
    )
    p.add_argument(
        "--one-gpu",
        action="store_true",
        help="the command on one GPU instead (`one_gpu_runs`): DIR's leaderboard_8b_one_gpu_command.csv",
    )
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.from_trace is not None:
        stream_tables(args.from_trace, args.out)
        return
    commit = (
        args.commit
        or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        or "unknown"
    )
    if args.append_json is not None:
        table = args.out / "leaderboard_8b_two_gpus_command.csv"
        append_result(table, json.loads(args.append_json.read_text()), commit, args.empty_caches).to_csv(
            table, index=False
        )
        return
    if args.one_gpu:
        one_gpu_runs(args, commit)
        return
    trace = args.out / "leaderboard_8b_two_gpus_trace.json.gz"
    results: list[dict] = []
    table = args.out / "leaderboard_8b_two_gpus_command.csv"
    for variant, nproc in RUNS:
        traced = trace if (variant, nproc) == ("ours", 2) else None
        run_logged(results, table, args, commit, variant, nproc, args.layers, trace=traced)
    if trace.exists():
        stream_tables(trace, args.out)


if __name__ == "__main__":
    main()
