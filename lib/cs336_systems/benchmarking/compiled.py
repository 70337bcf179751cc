"""torch.compile on the whole model (torch_compile part (b)), and our best step against Llama.

`compile_comparison` times each size and mode (forward, forward-backward, train-step) with the
vanilla and the compiled model, in one sweep. `best_versus_llama` takes our fastest training
step (bf16 autocast, compiled, the fastest of the given attention implementations) and the
Hugging Face Llama of the same architecture (llama_reference.py) on the same batch, in the same
run, and reports the step-time ratio against the bar (ours <= bar x Llama) and the model FLOPs
utilisation of both against the device's measured bf16 matmul ceiling (ceiling.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pandas as pd
from tqdm.auto import tqdm

from cs336_systems.accounting.flops import model_flops
from cs336_systems.benchmarking.harness import MODES, BenchmarkConfig, run_benchmark
from cs336_systems.benchmarking.llama_reference import run_llama_benchmark, transformers_available
from cs336_systems.benchmarking.sweep import grid, sweep


def compile_comparison(base: BenchmarkConfig, sizes: Sequence[str], modes: Sequence[str] = MODES, progress: bool = True) -> pd.DataFrame:
    """One row per (size, mode): vanilla and compiled mean/std ms, speedup = vanilla / compiled."""
    rows = sweep(grid(base, size=list(sizes), mode=list(modes), compile=[False, True]), desc="vanilla vs compiled", progress=progress)
    out = []
    for (size, mode), g in rows.groupby(["size", "mode"], sort=False):
        vanilla, compiled = g[~g["compile"]].iloc[0], g[g["compile"]].iloc[0]
        out.append(dict(
            size=size, mode=mode, context_length=base.context_length,
            vanilla_ms=vanilla["mean_ms"], vanilla_std_ms=vanilla["std_ms"],
            compiled_ms=compiled["mean_ms"], compiled_std_ms=compiled["std_ms"],
            speedup=vanilla["mean_ms"] / compiled["mean_ms"] if vanilla["status"] == compiled["status"] == "ok" else float("nan"),
            status=vanilla["status"] if vanilla["status"] == compiled["status"] else f"{vanilla['status']}/{compiled['status']}",
        ))
    return pd.DataFrame(out)


def _attempt(config: BenchmarkConfig) -> dict:
    """run_benchmark, with a failure other than OOM (e.g. a kernel that does not compile) kept as a row."""
    try:
        return run_benchmark(config)
    except Exception as err:  # noqa: BLE001 - recorded in the table, not hidden
        return {**config.label(), "status": "failed", "error": f"{type(err).__name__}: {str(err).splitlines()[0][:160]}"}


def best_versus_llama(
    base: BenchmarkConfig,
    sizes: Sequence[str],
    contexts: Sequence[int],
    attentions: Sequence[str] = ("sdpa", "flash_triton"),
    ceiling_tflops: float | None = None,
    bar: float = 0.8,
    compile: bool = True,
    progress: bool = True,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(summary, candidates): per (size, context), our best bf16 train step (compiled unless
    `compile=False`) vs Llama's (eager, as shipped).

    summary columns: size, context_length, best_attention, ours_ms, llama_ms, ratio, passes
    (ratio <= bar), and MFU of both when `ceiling_tflops` is given. `candidates` has every timed
    configuration, Llama included, with its status.
    """
    base = replace(base, mode="train-step", precision="bf16", compile=compile)
    rows, summary = [], []
    pairs = [(s, c) for s in sizes for c in contexts]
    for size, context in tqdm(pairs, desc="best vs Llama", disable=not progress, leave=False):
        config = replace(base, size=size, context_length=context, model_context_length=None)
        ours = [{**_attempt(replace(config, attention=a)), "model": "ours"} for a in attentions]
        if transformers_available():
            llama = run_llama_benchmark(replace(config, compile=False))
        else:
            llama = {**config.label(), "model": "llama", "status": "not run", "error": "transformers is not installed"}
        rows += ours + [llama]
        ok = [r for r in ours if r["status"] == "ok"]
        best = min(ok, key=lambda r: r["mean_ms"]) if ok else None
        row = dict(size=size, context_length=context, best_attention=best["attention"] if best else None,
                   ours_ms=best["mean_ms"] if best else float("nan"),
                   llama_ms=llama["mean_ms"] if llama["status"] == "ok" else float("nan"), llama_status=llama["status"])
        row["ratio"] = row["ours_ms"] / row["llama_ms"]
        row["passes"] = bool(row["ratio"] <= bar) if row["ratio"] == row["ratio"] else None
        if ceiling_tflops:
            flops = model_flops(config.model_config(), config.batch_size, context, "train-step")
            row["ours_mfu"] = flops / (row["ours_ms"] / 1e3) / (ceiling_tflops * 1e12)
            row["llama_mfu"] = flops / (row["llama_ms"] / 1e3) / (ceiling_tflops * 1e12)
        summary.append(row)
    return pd.DataFrame(summary), pd.DataFrame(rows)
