"""FlashAttention-2 against PyTorch attention: latency, achieved TFLOP/s and correctness per configuration.

Implementations: benchmarking/attention_registry.py's (`IMPLEMENTATIONS`), ours, the materialised
attention and SDPA restricted to one backend each; `fastest_sdpa` then keeps, per configuration, the
backend with the lowest forward+backward latency ("SDPA with its fastest backend").

Latency of each pass (benchmarking/timing.py's `measure_times_ms`):
  forward            o = f(q, k, v) with autograd recording, as in training
  backward           o.backward(dO, retain_graph=True) on one recorded forward: measured directly,
                     not as a difference of two noisy medians
  forward+backward   f(q, k, v).backward(dO)
with q, k, v gradients reset to None before every run, so no accumulation kernel is timed.

Device time of each pass (CUDA only, `{pass}_device_ms`): the same call captured once in a CUDA
graph and the graph replayed (`measure_device_ms`), so only its kernels are timed.

FLOPs counted as the matmuls of the algorithm (FlashAttention-2 paper convention):
  forward    4·B·H·N²·d   (S = Q Kᵀ and O = P V, 2·N²·d each), halved with the causal mask
  backward   2.5 × forward (five matmuls: S recomputed, dV = Pᵀ dO, dP = dO Vᵀ, dQ = dS K, dK = dSᵀ Q)
  fwd+bwd    3.5 × forward
This is the convention TFLOP/s figures are compared in (the paper's, the course leaderboard's); the kernels'
own FLOP formula for torch.utils.flop_counter (`attention.launch.dispatch.attention_flops`) counts the
causal mask's N(N+1)/2 (query, key) pairs exactly instead, since the partitioner weighs those FLOPs.

Every configuration is checked in the same run: O, dQ, dK, dV of each implementation against the
float64 reference (attention/reference.py) on the same (rounded) inputs, norm-wise relative error
‖x − ref‖ / ‖ref‖; above the dtype's sweep tolerance (`TOLERANCE[dtype].sweeps`) the row's status
is "wrong". Other statuses: "ok", "OOM", "no kernel" (an SDPA backend that cannot run this dtype or
device), "backend error" (an SDPA backend that accepted the inputs and then failed), "skipped:
memory" (the materialised attention whose predicted peak exceeds the memory budget, decided from
the shape before anything is allocated).
"""

from __future__ import annotations

import statistics
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace

import pandas as pd
import torch
from tqdm.auto import tqdm

from cs336_systems.attention.reference import TOLERANCE, reference_gradients
from cs336_systems.benchmarking.attention_registry import (
    IMPLEMENTATIONS,
    SDPA_BACKENDS,
    Implementation,
    implementation,
    is_no_kernel,
    relative_errors,
)
from cs336_systems.benchmarking.harness import free_device_memory, is_out_of_memory
from cs336_systems.benchmarking.timing import TimingSettings, measure_device_ms, measure_times_ms, round_orders
from cs336_systems.experiments.attention_benchmark import naive_attention_memory, random_qkv

PASSES = ("forward", "backward", "forward_backward")
PASS_FLOP_FACTOR = {"forward": 1.0, "backward": 2.5, "forward_backward": 3.5}


def attention_flops(batch: int, heads: int, seq_len: int, head_dim: int, is_causal: bool = True) -> dict[str, float]:
    """FLOPs of each pass (see the module docstring): forward 4·B·H·N²·d (/2 causal), ×2.5, ×3.5."""
    forward = 4 * batch * heads * seq_len**2 * head_dim / (2 if is_causal else 1)
    return {p: PASS_FLOP_FACTOR[p] * forward for p in PASSES}


def attention_min_bytes(batch: int, heads: int, seq_len: int, head_dim: int, dtype: torch.dtype) -> dict[str, int]:
    """Least HBM traffic of each pass: every input read once, every output written once.

    forward   read Q, K, V, write O (input dtype) and L (fp32, B·H·N)
    backward  read Q, K, V, O, dO, L, write dQ, dK, dV
    """
    tensor = batch * heads * seq_len * head_dim * dtype.itemsize
    lse = batch * heads * seq_len * 4
    forward, backward = 4 * tensor + lse, 8 * tensor + lse
    return dict(forward=forward, backward=backward, forward_backward=forward + backward)


def naive_peak_bytes(batch: int, heads: int, seq_len: int, head_dim: int, dtype: torch.dtype) -> int:
    """Predicted peak of the materialised attention's forward+backward
    (experiments/attention_benchmark.py's accounting)."""
    parts = naive_attention_memory(batch * heads, seq_len, head_dim, dtype.itemsize)
    return parts["before_backward"] + parts["backward_extra"]


def _three_passes(
    impl: Implementation,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    grad_out: torch.Tensor,
    is_causal: bool,
    measure: Callable[[Callable[[], object]], list[float]],
) -> dict[str, list[float]]:
    """The forward, the backward alone (on one recorded forward) and the forward+backward, each timed by
    `measure`, with q, k, v's gradients None afterwards."""
    times = {}
    with impl.context():
        times["forward"] = measure(lambda: impl.apply(q, k, v, is_causal))
        out = impl.apply(q, k, v, is_causal)
        times["backward"] = measure(lambda: out.backward(grad_out, retain_graph=True))
        out = None  # frees the recorded forward's graph before the forward+backward is timed
        times["forward_backward"] = measure(lambda: impl.apply(q, k, v, is_causal).backward(grad_out))
    q.grad = k.grad = v.grad = None
    return times


def time_passes(
    impl: Implementation,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    grad_out: torch.Tensor,
    is_causal: bool,
    settings: TimingSettings,
) -> dict[str, list[float]]:
    """Measured run times (ms) of the forward, the backward alone, and the forward+backward."""
    return _three_passes(
        impl, q, k, v, grad_out, is_causal, lambda fn: measure_times_ms(fn, q.device, settings, (q, k, v))
    )


def device_passes(
    impl: Implementation,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    grad_out: torch.Tensor,
    is_causal: bool,
    settings: TimingSettings,
) -> dict[str, list[float]]:
    """`time_passes`'s three calls, each timed as a replayed CUDA graph (`measure_device_ms`).

    They run on a stream of their own, and so does the forward whose backward is captured: a backward runs
    on its forward's stream, and one recorded on the legacy default stream cannot join a capture (CUDA
    refuses to make the legacy stream wait on a capturing stream, cudaErrorStreamCaptureImplicit, and the
    first captured backward of a sweep fails)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    try:
        with torch.cuda.stream(side):
            return _three_passes(
                impl, q, k, v, grad_out, is_causal, lambda fn: measure_device_ms(fn, settings, (q, k, v))
            )
    finally:
        torch.cuda.current_stream().wait_stream(side)


def _device_columns(impl: Implementation, q, k, v, grad_out, is_causal: bool, settings: TimingSettings) -> dict:
    """`{pass}_device_ms` medians on CUDA (none elsewhere); a capture that fails leaves them out and says
    why in `note`: the latencies stand, and the row shows that this one was not measured."""
    if q.device.type != "cuda":
        return {}
    if impl.no_device_time:
        return dict(note=f"device time not measured: {impl.no_device_time}")
    torch.cuda.empty_cache()  # a graph allocates from its own pool, which the eager runs' cached blocks would crowd
    try:
        times = device_passes(impl, q, k, v, grad_out, is_causal, settings)
    except Exception as err:  # noqa: BLE001 - recorded in the row; the eager measurement is the result
        kind = "out of memory" if is_out_of_memory(err) else type(err).__name__
        failure = dict(note=f"device time not measured ({kind}): {_first_line(str(err))}")
    else:
        return {f"{p}_device_ms": statistics.median(times[p]) for p in PASSES}
    q.grad = k.grad = v.grad = None
    free_device_memory()  # here, once the exception no longer holds the failed capture's tensors
    return failure


def _first_line(text: str, limit: int = 240) -> str:
    return text.strip().splitlines()[0][:limit] if text.strip() else ""


def failure_row(
    err: BaseException, impl: Implementation, caught: Iterable[warnings.WarningMessage] = ()
) -> dict | None:
    """The row of a failure that the sweep records and survives, or None for one that must stop it.

    OOM; "no kernel" (with the reasons torch warned about); "backend error": an SDPA backend that
    accepted the inputs and then failed (e.g. a cuDNN graph that does not build) is a finding about
    that library, while our kernels failing is a bug.
    """
    if is_out_of_memory(err):
        return dict(status="OOM", note=_first_line(str(err)))
    if is_no_kernel(err):
        reasons = dict.fromkeys(_first_line(str(w.message)) for w in caught)  # ordered, unique
        return dict(status="no kernel", note=" | ".join(r for r in reasons if r) or _first_line(str(err)))
    if impl.backend is not None and isinstance(err, RuntimeError):
        return dict(status="backend error", note=_first_line(str(err)))
    return None


def _guarded(impl: Implementation, q, k, v, step: Callable[[], dict], caught: list) -> dict:
    """`step()`'s columns, or the row of a failure the sweep records (`failure_row`); others raise."""
    try:
        return step()
    except Exception as err:  # noqa: BLE001 - failure_row decides which failures become rows
        q.grad = k.grad = v.grad = None
        failure = failure_row(err, impl, caught)
        if failure is None:
            raise
    free_device_memory()  # here, once the exception no longer holds the failed call's tensors
    return failure


def check_implementation(
    impl: Implementation,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    grad_out: torch.Tensor,
    is_causal: bool,
    reference: dict[str, torch.Tensor],
    settings: TimingSettings,
) -> dict:
    """Status and error against the reference of one implementation on one input, and its device times
    (CUDA), or the row of a failure the sweep records."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        row = _guarded(
            impl,
            q,
            k,
            v,
            lambda: _error_columns(
                relative_errors(impl, q, k, v, grad_out, is_causal, reference), TOLERANCE[q.dtype].sweeps
            ),
            caught,
        )
    if "max_rel_error" in row:
        row.update(_device_columns(impl, q, k, v, grad_out, is_causal, settings))
    return row


def _error_columns(errors: dict[str, float], tolerance: float) -> dict:
    worst = max(errors, key=lambda name: errors[name] if errors[name] == errors[name] else float("inf"))
    ok = all(e <= tolerance for e in errors.values())  # NaN compares False: never ok
    return dict(max_rel_error=errors[worst], worst_tensor=worst, status="ok" if ok else "wrong")


def _time_columns(times: dict[str, list[float]]) -> dict:
    row = {f"{p}_ms": statistics.median(times[p]) for p in PASSES}
    row["runs"] = min(len(t) for t in times.values())
    return row


def timed_in_rounds(
    impls: Sequence[Implementation],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    grad_out: torch.Tensor,
    is_causal: bool,
    settings: TimingSettings,
) -> dict[str, dict]:
    """Per implementation, the latency columns (`{pass}_ms`, `runs`) or a failure row, timed in
    `settings.rounds` interleaved rounds: in round r the implementations take turns starting with the
    r-th, each with rep_ms / rounds of measuring time (min_runs / rounds runs at least, cpu_steps / rounds
    calls on CPU, rounded up), and a pass's latency is the median over every round's runs.

    Why rounds: a host that slows down for a while (on shared GPU hosts the eager medians of the shortest
    kernels moved by several times their length for a configuration or two, and not in the next run:
    docs/measurements_record.md) then slows one round of several implementations rather than all of one
    implementation's runs, and the median over rounds holds. A failure in any round makes the
    implementation's row that failure."""
    rounds = max(1, settings.rounds)
    share = replace(
        settings,
        rep_ms=settings.rep_ms / rounds,
        min_runs=max(1, -(-settings.min_runs // rounds)),
        cpu_steps=max(1, -(-settings.cpu_steps // rounds)),
    )
    runs: dict[str, dict[str, list[float]]] = {impl.name: {p: [] for p in PASSES} for impl in impls}
    failed: dict[str, dict] = {}
    for order in round_orders(impls, rounds):
        for impl in order:
            if impl.name in failed:
                continue
            timed = _guarded(
                impl, q, k, v, lambda impl=impl: dict(times=time_passes(impl, q, k, v, grad_out, is_causal, share)), []
            )
            if "times" not in timed:
                failed[impl.name] = timed
                continue
            for p in PASSES:
                runs[impl.name][p].extend(timed["times"][p])
    return {impl.name: failed.get(impl.name) or _time_columns(runs[impl.name]) for impl in impls}


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def flash_benchmark(
    seq_lens: Iterable[int],
    head_dims: Iterable[int],
    dtypes: Iterable[torch.dtype],
    impls: Iterable[str] = IMPLEMENTATIONS,
    *,
    batch: int = 1,
    heads: int = 1,
    is_causal: bool = True,
    device: torch.device | str = "cpu",
    settings: TimingSettings = TimingSettings(),
    memory_budget_bytes: int | None = None,
    memory_fraction: float = 0.4,
    progress: bool = True,
) -> pd.DataFrame:
    """One row per implementation × dtype × head dimension × sequence length (see the module docstring).

    The materialised attention is skipped ("skipped: memory") where its predicted peak exceeds
    `memory_budget_bytes` (default: `memory_fraction` of the GPU's memory; no limit on CPU).
    """
    device = torch.device(device)
    seq_lens, head_dims, dtypes = sorted(seq_lens), list(head_dims), list(dtypes)
    impls = [implementation(name) for name in impls]
    if not (seq_lens and head_dims and dtypes and impls):
        raise ValueError("flash_benchmark needs at least one sequence length, head dimension, dtype and implementation")
    if memory_budget_bytes is None and device.type == "cuda":
        memory_budget_bytes = int(memory_fraction * torch.cuda.get_device_properties(device).total_memory)
    configs = [(dt, d, n) for dt in dtypes for d in head_dims for n in seq_lens]
    rows = []
    bar = tqdm(total=len(configs) * len(impls), desc="flash benchmark", disable=not progress, leave=False)
    for dtype, d, n in configs:
        flops = attention_flops(batch, heads, n, d, is_causal)
        q, k, v = random_qkv((batch, heads, n, d), device=device, dtype=dtype, seed=n + d)
        gen = torch.Generator().manual_seed(n + d + 1)
        grad_out = torch.randn(batch, heads, n, d, generator=gen).to(device=device, dtype=dtype)
        reference = reference_gradients(q, k, v, grad_out, is_causal)
        here, checked = {}, []
        for impl in impls:
            bar.set_postfix_str(f"{impl.name} {_dtype_name(dtype)} d={d} N={n}")
            row = dict(
                impl=impl.name,
                batch=batch,
                heads=heads,
                seq_len=n,
                head_dim=d,
                dtype=_dtype_name(dtype),
                is_causal=is_causal,
            )
            peak = naive_peak_bytes(batch, heads, n, d, dtype)
            if impl.name == "pytorch" and memory_budget_bytes is not None and peak > memory_budget_bytes:
                row.update(
                    status="skipped: memory",
                    note=f"predicted peak {peak / 2**30:.1f} GiB > budget {memory_budget_bytes / 2**30:.1f} GiB",
                )
            else:
                row.update(check_implementation(impl, q, k, v, grad_out, is_causal, reference, settings))
                if "max_rel_error" in row:
                    checked.append(impl)
            here[impl.name] = row
        bar.set_postfix_str(f"timing {_dtype_name(dtype)} d={d} N={n}")
        for name, columns in timed_in_rounds(checked, q, k, v, grad_out, is_causal, settings).items():
            here[name].update(columns)
        for impl in impls:
            row = here[impl.name]
            for p in PASSES:
                row[f"{p}_tflops"] = flops[p] / (row[f"{p}_ms"] * 1e-3) / 1e12 if f"{p}_ms" in row else float("nan")
            rows.append(row)
            bar.update()
        del q, k, v, grad_out, reference
        if device.type == "cuda":
            free_device_memory()
    bar.close()
    return _tidy(pd.DataFrame(rows))


RESULT_COLUMNS = [
    "impl",
    "backend",
    "batch",
    "heads",
    "seq_len",
    "head_dim",
    "dtype",
    "is_causal",
    "status",
    *(f"{p}_ms" for p in PASSES),
    *(f"{p}_device_ms" for p in PASSES),
    *(f"{p}_tflops" for p in PASSES),
    "max_rel_error",
    "worst_tensor",
    "runs",
    "note",
]


def _tidy(df: pd.DataFrame) -> pd.DataFrame:
    for col in RESULT_COLUMNS:
        if col not in df:  # times and rates stay numeric (NaN), so a column no row measured still compares
            df[col] = float("nan") if col.endswith(("_ms", "_tflops")) else pd.NA
    return df[RESULT_COLUMNS]


def fastest_sdpa(df: pd.DataFrame) -> pd.DataFrame:
    """Per configuration, the SDPA backend row with the lowest forward+backward latency, as impl "sdpa".

    Only backends that ran and passed the check compete; where none did, the row says why.
    """
    keys = ["batch", "heads", "seq_len", "head_dim", "dtype", "is_causal"]
    sdpa = df[df.impl.isin(list(SDPA_BACKENDS))]
    rows = []
    for _, group in sdpa.groupby(keys, sort=False):
        ok = group[group.status == "ok"]
        if len(ok):
            best = ok.loc[ok.forward_backward_ms.astype(float).idxmin()].copy()
            best["backend"] = best.impl.removeprefix("sdpa_")
        else:
            best = group.iloc[0].copy()
            best["status"] = "no backend ran"
            best["note"] = "; ".join(f"{r.impl}: {r.status}" for r in group.itertuples())
        best["impl"] = "sdpa"
        rows.append(best)
    return pd.DataFrame(rows, columns=df.columns)


def comparison_table(df: pd.DataFrame) -> pd.DataFrame:
    """The deliverable: ours, the materialised PyTorch attention and SDPA with its fastest backend."""
    table = pd.concat([df[df.impl.isin(["triton", "pytorch"])], fastest_sdpa(df)], ignore_index=True)
    order = {"triton": 0, "pytorch": 1, "sdpa": 2}
    return table.sort_values(
        ["dtype", "head_dim", "seq_len", "impl"],
        key=lambda c: c.map(order) if c.name == "impl" else c,
        ignore_index=True,
    )


def compare_latencies(
    df: pd.DataFrame,
    impl: str,
    baseline: str,
    factor: float = 1.0,
    *,
    min_seq_len: int = 0,
    dtypes: Iterable[str] | None = None,
    value: str = "ms",
) -> pd.DataFrame:
    """`impl` against `baseline` at every grid point where the baseline ran (status "ok"), per pass.

    One row per (configuration, pass): both times (columns `{pass}_{value}`: "ms" the eager latency,
    "device_ms" the device time), ratio = impl / baseline, and `slower`, true where the ratio exceeds
    `factor` or `impl` itself did not run correctly (any status but "ok", with the ratio left NaN).
    A time that was not measured (NaN) gives a NaN ratio that is not `slower`: callers count those.
    """
    keys = ["dtype", "head_dim", "seq_len"]
    sel = df[df.seq_len >= min_seq_len]
    if dtypes is not None:
        sel = sel[sel.dtype.isin(list(dtypes))]
    mine, base = sel[sel.impl == impl], sel[(sel.impl == baseline) & (sel.status == "ok")]
    both = mine.merge(base, on=keys, suffixes=("", "_baseline"))
    rows = []
    for r in both.itertuples():
        for p in PASSES:
            ms, base_ms = float(getattr(r, f"{p}_{value}")), float(getattr(r, f"{p}_{value}_baseline"))
            ratio = ms / base_ms if r.status == "ok" else float("nan")
            rows.append(
                {
                    "dtype": r.dtype,
                    "head_dim": r.head_dim,
                    "seq_len": r.seq_len,
                    "pass": p,
                    "status": r.status,
                    "ms": ms,
                    "baseline_ms": base_ms,
                    "ratio": ratio,
                    "slower": r.status != "ok" or ratio > factor,
                }
            )
    return pd.DataFrame(rows, columns=[*keys, "pass", "status", "ms", "baseline_ms", "ratio", "slower"])


def bar_verdict(name: str, cmp: pd.DataFrame, shown: int = 15) -> tuple[str, str]:
    """A bar checked on a `compare_latencies` table: ("PASS" | "FAIL" | "not checked", a markdown line
    naming the offending point-passes, the first `shown` of them, and any that had no measurement)."""
    from cs336_systems.report.tables import fmt_ms

    points = cmp.drop_duplicates(["dtype", "head_dim", "seq_len"]).shape[0]
    unmeasured = int(((cmp.status == "ok") & cmp.ratio.isna()).sum())
    if points == 0 or unmeasured == len(cmp):
        return "not checked", f"**{name}: not checked** — no point of this run's grid has both measurements."
    bad = cmp[cmp.slower]
    verdict = "PASS" if bad.empty else "FAIL"
    text = f"**{name}: {verdict}** — {points} points compared (× 3 passes), {len(bad)} offending"
    text += f", {unmeasured} point-passes without both times." if unmeasured else "."
    if not bad.empty:
        text += (
            " Offending: "
            + ", ".join(
                f"{r['dtype']} d = {r['head_dim']} N = {r['seq_len']:,} {r['pass'].replace('_', '+')}: "
                + (
                    f"{fmt_ms(r['ms'])} vs {fmt_ms(r['baseline_ms'])} ({r['ratio']:.2f}×)"
                    if r["status"] == "ok"
                    else f"ours {r['status']}"
                )
                for r in bad.head(shown).to_dict("records")
            )
            + (" …" if len(bad) > shown else "")
            + "."
        )
    return verdict, text


def eager_and_device(df: pd.DataFrame, impls: Iterable[str] = ("triton", "sdpa_flash")) -> pd.DataFrame:
    """Per implementation, configuration and pass, for rows that ran correctly with both times measured:
    the eager latency `ms`, the device time `device_ms` and `outside_ms` = ms − device_ms, what the
    eager call spends beyond its kernels' time (host work the L2 flush before each run did not hide)."""
    keys = ["impl", "dtype", "head_dim", "seq_len"]
    ok = df[df.impl.isin(list(impls)) & (df.status == "ok")]
    parts = []
    for p in PASSES:
        part = ok[keys].assign(
            **{
                "pass": p,
                "ms": pd.to_numeric(ok[f"{p}_ms"], errors="coerce"),
                "device_ms": pd.to_numeric(ok[f"{p}_device_ms"], errors="coerce"),
            }
        )
        parts.append(part)
    both = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=[*keys, "pass", "ms", "device_ms"])
    both = both.dropna(subset=["ms", "device_ms"]).reset_index(drop=True)
    both["outside_ms"] = both.ms - both.device_ms
    return both


IMPL_LABELS = {"triton": "ours (Triton)", "pytorch": "PyTorch, materialised", "sdpa": "SDPA, fastest backend"}


def latency_pivot(table: pd.DataFrame) -> pd.DataFrame:
    """The comparison table wide: one row per configuration, one column per pass × implementation (ms)."""
    wide = table.pivot_table(
        index=["dtype", "head_dim", "seq_len"], columns="impl", aggfunc="first", values=[f"{p}_ms" for p in PASSES]
    )
    wide = wide.reindex(columns=[(f"{p}_ms", i) for p in PASSES for i in IMPL_LABELS if (f"{p}_ms", i) in wide])
    short = {"forward_ms": "fwd", "backward_ms": "bwd", "forward_backward_ms": "fwd+bwd"}
    wide.columns = [f"{short[p]} {i} (ms)" for p, i in wide.columns]
    backends = table[table.impl == "sdpa"].set_index(["dtype", "head_dim", "seq_len"]).backend.rename("sdpa backend")
    return wide.join(backends).reset_index()


def latencies_long(table: pd.DataFrame, value: str = "ms") -> pd.DataFrame:
    """One row per implementation × configuration × pass (`value` "ms" or "tflops"), for plotting."""
    ok = table[table.status.isin(["ok", "wrong"])]
    cols = {f"{p}_{value}": p.replace("_", "+") for p in PASSES}
    long = ok.melt(
        id_vars=["impl", "backend", "seq_len", "head_dim", "dtype"],
        value_vars=list(cols),
        var_name="pass",
        value_name=value,
    )
    long["pass"] = long["pass"].map(cols)
    long["implementation"] = long.impl.map(IMPL_LABELS).fillna(long.impl)
    long[value] = long[value].astype(float)
    return long
