"""torch.compile on the model (torch_compile part (b)), and our best step against Llama.

`compile_comparison` times each size and mode (forward, forward-backward, train-step) with the
vanilla and the compiled model (the whole model, or block by block), in one sweep, and measures the
vanilla step's regime (`launch_bound`: its GPU-busy share and its time as a CUDA graph), since what
compiling gains on a launch-bound step is mostly fewer launches.
`best_versus_llama` takes our fastest training step (bf16 autocast, compiled, the fastest of the
given attention implementations) and the Hugging Face Llama of the same architecture
(llama_reference.py) on the same batch, in the same run, and reports the step-time ratio against
the bar (ours <= bar x Llama) and the model FLOPs utilisation of both against the device's
measured bf16 matmul ceiling (ceiling.py), with Llama compiled too and where each step's time
goes (forward, backward, optimizer: host wall time against device compute time).
`optimizer_comparison` times one configuration with each AdamW of cs336_systems.optim.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import pandas as pd
from tqdm.auto import tqdm

from cs336_systems.accounting.flops import model_flops
from cs336_systems.benchmarking.harness import (
    MODES,
    BenchmarkConfig,
    TrainingSetup,
    build,
    free_device_memory,
    run_benchmark,
)
from cs336_systems.benchmarking.launch_bound import launch_probe, with_regime
from cs336_systems.benchmarking.llama_reference import INSTALL_HINT, run_llama_benchmark, transformers_available
from cs336_systems.optim import OPTIMIZERS
from cs336_systems.profiling.torch_profile import step_phases


def compile_comparison(
    base: BenchmarkConfig,
    sizes: Sequence[str],
    modes: Sequence[str] = MODES,
    progress: bool = True,
    probe: bool = True,
) -> pd.DataFrame:
    """One row per (size, mode): vanilla and compiled mean/std ms, speedup = vanilla / compiled,
    the compile scope (`base.compile_scope`: whole model or each block) and the compiled model's
    first call in that mode (`compiled_first_call_s`: the compilation of the graph that mode
    needs first, or an already compiled step); with `probe`, the vanilla step's `busy_fraction`,
    `graph_speedup` and `regime` (`launch_bound.launch_probe` after its timed steps, on the same model).

    Each (size, vanilla or compiled) model is built and compiled once and timed in every mode:
    forward-backward and train-step run the same compiled graphs (the optimizer step is outside
    them) and the no-grad forward adds one graph to the same compilation, so a size costs one
    compilation rather than one per mode (most of this table's run time on a GPU).
    """
    rows = []
    for size, compiled in tqdm(
        [(s, c) for s in sizes for c in (False, True)], desc="vanilla vs compiled", disable=not progress, leave=False
    ):
        then = launch_probe() if probe and not compiled else None
        rows += time_modes(replace(base, size=size, compile=compiled), modes, then)
    rows = pd.DataFrame(rows)
    if probe:
        rows = with_regime(rows)
    out = []
    for (size, mode), g in rows.groupby(["size", "mode"], sort=False):
        vanilla, compiled = g[~g["compile"]].iloc[0], g[g["compile"]].iloc[0]
        first_calls = compiled.get("warmup_times_ms")
        out.append(
            dict(
                size=size,
                mode=mode,
                context_length=base.context_length,
                scope=base.compile_scope,
                vanilla_ms=vanilla.get("mean_ms"),
                vanilla_std_ms=vanilla.get("std_ms"),
                compiled_ms=compiled.get("mean_ms"),
                compiled_std_ms=compiled.get("std_ms"),
                speedup=vanilla["mean_ms"] / compiled["mean_ms"]
                if vanilla["status"] == compiled["status"] == "ok"
                else float("nan"),
                compiled_first_call_s=first_calls[0] / 1e3
                if isinstance(first_calls, list) and first_calls
                else float("nan"),
                status=vanilla["status"]
                if vanilla["status"] == compiled["status"]
                else f"{vanilla['status']}/{compiled['status']}",
                **(
                    {k: vanilla.get(k) for k in ("busy_fraction", "graph_speedup", "regime")} if probe else {}
                ),  # the vanilla step's regime
            )
        )
    return pd.DataFrame(out)


def time_modes(
    config: BenchmarkConfig, modes: Sequence[str], then: Callable[[TrainingSetup], dict] | None = None
) -> list[dict]:
    """`run_benchmark` of `config` in each mode, all on one model built (and compiled) once, with
    its optimizer (`then`: `run_benchmark`'s, after each mode's timed steps). A mode that runs out of
    memory is a row; the next mode tries again."""
    shared: dict[str, TrainingSetup] = {}

    def reuse(c: BenchmarkConfig) -> TrainingSetup:
        if "setup" not in shared:
            shared["setup"] = build(replace(c, mode="train-step"))
        return replace(shared["setup"], config=c)

    try:
        return [run_benchmark(replace(config, mode=mode), builder=reuse, then=then) for mode in modes]
    finally:
        shared.clear()
        free_device_memory()


def _attempt(config: BenchmarkConfig, run: Callable[..., dict] = run_benchmark, **labels) -> dict:
    """`run(config, then=step_phases)`: the timed row plus where its step's time went, built and
    compiled once. A failure other than OOM (e.g. a kernel that does not compile) is kept as a row."""
    try:
        return {**run(config, then=step_phases), **labels}
    except Exception as err:  # noqa: BLE001 - recorded in the table, not hidden
        return {
            **config.label(),
            **labels,
            "status": "failed",
            "error": f"{type(err).__name__}: {str(err).splitlines()[0][:160]}",
        }


def best_versus_llama(
    base: BenchmarkConfig,
    sizes: Sequence[str],
    contexts: Sequence[int],
    attentions: Sequence[str] = ("sdpa", "flash_triton"),
    optimizer: str = "torch-adamw-fused",
    ceiling_tflops: float | None = None,
    bar: float = 0.8,
    compile: bool = True,
    compile_scope: str = "blocks",
    llama_compiled: bool | Sequence[tuple[str, int]] = True,
    progress: bool = True,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(summary, candidates): per (size, context), our best bf16 train step vs Llama's, eager as
    shipped, both stepped by the same `optimizer` (one of cs336_systems.optim.OPTIMIZERS).

    Our best: the fastest of `attentions` timed eagerly, then that one compiled (unless
    `compile=False`), block by block unless `compile_scope="model"` (harness.compile_fresh: the
    compile time of one block, not of the whole depth). The attention kernels are opaque to the
    compiler, which fuses what lies between them, so their order does not change under
    compilation; choosing eagerly saves a compilation per losing candidate. `llama_compiled` also
    compiles Llama, at every pair (True), none (False) or the listed (size, context) pairs: the
    same compiler, and the same scope, on both.

    summary columns: size, context_length, best_attention, optimizer, ours_ms, llama_ms,
    llama_status, ratio (ours / Llama eager), passes (ratio <= bar), llama_compiled_ms and
    ratio_vs_compiled where Llama was compiled, and MFU of each when `ceiling_tflops` is given.
    `candidates` has every timed configuration with its status and, for those that ran, the
    wall and compute time of its forward, backward and optimizer step (step_phases).
    """
    base = replace(base, mode="train-step", precision="bf16", optimizer=optimizer)
    rows, summary = [], []
    pairs = [(s, c) for s in sizes for c in contexts]
    for size, context in tqdm(pairs, desc="best vs Llama", disable=not progress, leave=False):
        config = replace(base, size=size, context_length=context, model_context_length=None, compile=False)
        ours = [_attempt(replace(config, attention=a), model="ours") for a in attentions]
        ok = [r for r in ours if r["status"] == "ok"]
        best = min(ok, key=lambda r: r["mean_ms"]) if ok else None
        if best is not None and compile:
            best = _attempt(
                replace(config, attention=best["attention"], compile=True, compile_scope=compile_scope), model="ours"
            )
            ours.append(best)
            best = best if best["status"] == "ok" else None
        references = []
        if transformers_available():
            references.append(_attempt(config, run_llama_benchmark, model="llama"))
            if compile and (
                llama_compiled is True or (llama_compiled and (size, context) in set(map(tuple, llama_compiled)))
            ):
                references.append(
                    _attempt(
                        replace(config, compile=True, compile_scope=compile_scope), run_llama_benchmark, model="llama"
                    )
                )
        else:
            references.append(
                {
                    **config.label(),
                    "model": "llama",
                    "status": "not run",
                    "error": f"transformers is not installed: {INSTALL_HINT}",
                }
            )
        rows += ours + references
        llama = references[0]
        row = dict(
            size=size,
            context_length=context,
            best_attention=best["attention"] if best else None,
            optimizer=optimizer,
            ours_ms=best["mean_ms"] if best else float("nan"),
            llama_ms=llama["mean_ms"] if llama["status"] == "ok" else float("nan"),
            llama_status=llama["status"],
        )
        row["ratio"] = row["ours_ms"] / row["llama_ms"]
        row["passes"] = bool(row["ratio"] <= bar) if row["ratio"] == row["ratio"] else None
        if len(references) > 1:
            row["llama_compiled_ms"] = references[1]["mean_ms"] if references[1]["status"] == "ok" else float("nan")
            row["ratio_vs_compiled"] = row["ours_ms"] / row["llama_compiled_ms"]
        if ceiling_tflops:
            flops = model_flops(config.model_config(), config.batch_size, context, "train-step")
            for key in ("ours", "llama", "llama_compiled"):
                if f"{key}_ms" in row:
                    row[f"{key}_mfu"] = flops / (row[f"{key}_ms"] / 1e3) / (ceiling_tflops * 1e12)
        summary.append(row)
    return pd.DataFrame(summary), pd.DataFrame(rows)


def step_phase_table(summary: pd.DataFrame, candidates: pd.DataFrame) -> pd.DataFrame:
    """Long form, per (size, context): our best configuration, Llama eager and Llama compiled,
    each phase's wall and compute ms (columns size, context_length, model, phase, wall_ms,
    compute_ms)."""
    ok = candidates[candidates.status == "ok"]
    out = []
    for r in summary.itertuples():
        at = ok[(ok["size"] == r.size) & (ok.context_length == r.context_length)]
        ours = at[(at.model == "ours") & (at.attention == r.best_attention)]
        picks = [
            ("ours (best)", ours.sort_values("compile", ascending=False)),
            ("Llama eager", at[(at.model == "llama") & ~at["compile"].astype(bool)]),
            ("Llama compiled", at[(at.model == "llama") & at["compile"].astype(bool)]),
        ]
        for label, rows in picks:
            if not len(rows) or "forward_wall_ms" not in rows:
                continue
            first = rows.iloc[0]
            for phase in ("forward", "backward", "optimizer"):
                out.append(
                    dict(
                        size=r.size,
                        context_length=r.context_length,
                        model=label,
                        phase=phase,
                        wall_ms=first[f"{phase}_wall_ms"],
                        compute_ms=first[f"{phase}_compute_ms"],
                    )
                )
    return pd.DataFrame(out)


def optimizer_comparison(config: BenchmarkConfig, optimizers: Sequence[str] = OPTIMIZERS) -> pd.DataFrame:
    """The training step of `config` with each optimizer: step time and the optimizer phase's wall
    and compute ms (one row per optimizer, failures and OOM kept as rows)."""
    rows = [_attempt(replace(config, mode="train-step", optimizer=name), model="ours") for name in optimizers]
    columns = ["optimizer", "status", "mean_ms", "std_ms", "optimizer_wall_ms", "optimizer_compute_ms", "error"]
    return pd.DataFrame(rows).reindex(columns=columns)
