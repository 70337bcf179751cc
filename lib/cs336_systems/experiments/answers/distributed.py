"""Answers of the distributed notebooks: all-reduce benchmark (12), naive and flat DDP (13), overlapping
DDP (14), bucketed DDP (15), optimizer state sharding (16) and FSDP (17).

Every timing is compared with the run's own baseline or with PyTorch's implementation of the same job
measured in the same run (DistributedDataParallel, ZeroRedundancyOptimizer, FSDP2's `fully_shard`). A
run's setting (model, batch, ranks, backend) comes from the notebook's `*_setup` table; runs that
predate it fall back to the note of the notebook's headline record.

Notebooks 13, 14, 16 and 17 time several model sizes in one run (a `size` column): an answer reads the
rows of its handout's XL model (2025: "xl"; 2026: the 2.7B's shape) where the run has them and they can
answer, else those of another size, with a caveat saying which model the numbers are for and why.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from cs336_systems.experiments.answers import NotAnswered, Results, builds, builds_each_handout
from cs336_systems.experiments.answers.words import and_join, pct
from cs336_systems.report.answers import Answer

NB_ALLREDUCE = "12_distributed_communication"
NB_NAIVE = "13_naive_ddp"
NB_INDIVIDUAL = "14_ddp_overlap_individual"
NB_BUCKETED = "15_ddp_bucketed"
NB_SHARDING = "16_optimizer_state_sharding"
NB_FSDP = "17_fsdp"

XL_2026 = "2.7B"  # the library's name of the 2026 handout's xl (d_model 2560, d_ff 10240, 32 layers, 32 heads)


# ---------------------------------------------------------------- formatting


def _ms(x: float) -> str:
    return f"{x:,.1f} ms" if abs(x) >= 10 else f"{x:.2f} ms" if abs(x) >= 0.1 else f"{x:.3f} ms"


def _x(r: float) -> str:
    """A ratio that still reads when small: 1.02×, 0.80×, 0.003×."""
    return f"{r:.2f}×" if abs(r) >= 0.1 else f"{r:.2g}×"


def _gb(x: float, unit: str = "GB") -> str:
    return f"{x:.2f} {unit}" if unit == "GB" else f"{x:.3f} {unit}"


def _inside_spread(a: float, a_std: float, b: float, b_std: float) -> bool:
    """Whether two mean step times are closer than their steps' combined standard deviation."""
    return abs(a - b) < math.hypot(a_std, b_std)


def _spread_note(pairs: list[tuple[str, pd.Series, pd.Series]]) -> str:
    """A sentence naming the comparisons (label, row a, row b) that the steps' spread does not separate."""
    close = [
        (label, a, b) for label, a, b in pairs if _inside_spread(a.step_ms, a.step_std_ms, b.step_ms, b.step_std_ms)
    ]
    if not close:
        return ""
    parts = [
        f"{label} ({abs(a.step_ms - b.step_ms):.1f} ms apart, spread ±{math.hypot(a.step_std_ms, b.step_std_ms):.1f} "
        "ms)"
        for label, a, b in close
    ]
    return (
        f" The step-to-step standard deviation is larger than the difference for {' and '.join(parts)}, so this "
        f"run does not separate {'them' if len(close) > 1 else 'that pair'}."
    )


def _noise_note(base: pd.Series, rows: dict[str, pd.Series]) -> str:
    """A sentence when a flavour that communicates is faster than the step without communication."""
    faster = [name for name, r in rows.items() if r.step_ms < base.step_ms]
    if not faster:
        return ""
    names = faster[0] if len(faster) == 1 else f"{', '.join(faster[:-1])} and {faster[-1]}"
    return (
        f" ({names[0].upper() + names[1:]} measured faster than the step without communication, which can only be "
        "noise between steps on this machine.)"
    )


# ---------------------------------------------------------------- the run's setting


def _count(params: float) -> str:
    return f"{params / 1e6:,.1f} M parameters" if params >= 1e7 else f"{params:,.0f} parameters"


def _bytes(x: float) -> str:
    return f"{x / 1e9:.2f} GB" if x >= 1e9 else f"{x / 1e6:.2f} MB"


def _rate(bytes_per_s: float) -> str:
    return f"{bytes_per_s / 1e9:.3g} GB/s" if bytes_per_s >= 1e9 else f"{bytes_per_s / 1e6:.3g} MB/s"


def _model_shape(size: str, params: float | None = None) -> str:
    """'d_model 1600, d_ff 6400, 48 layers, 25 heads; 1,998.2 M parameters' from the library's size table."""
    from cs336_systems.accounting.sharding import setup_for_model
    from cs336_systems.model import MODEL_SIZES, ModelConfig

    dims = MODEL_SIZES.get(size)
    if dims is None:
        return _count(params) if params else ""
    params = params or setup_for_model(ModelConfig.from_size(size), 2).num_params
    layers, heads = dims["num_layers"], dims["num_heads"]
    return (
        f"d_model {dims['d_model']}, d_ff {dims['d_ff']}, {layers} layer{'s' * (layers != 1)}, "
        f"{heads} head{'s' * (heads != 1)}; {_count(params)}"
    )


def _is_xl(size: str | None, handout: str) -> bool:
    """Whether `size` is `handout`'s XL model, by shape (the 2026 xl runs as "2.7B" or "xl-2026")."""
    from cs336_systems.model import handout_name

    return size is not None and handout_name(str(size), handout) == "xl"


def _model_name(size: str) -> str:
    if _is_xl(size, "2025"):
        return "the 2025 handout's XL model"
    return "the 2026 handout's xl model" if _is_xl(size, "2026") else f"the `{size}` model"


@dataclass
class _Rows:
    """The rows of a several-size table that answer one handout."""

    rows: pd.DataFrame
    size: str | None  # None: the table has no size column (a run of one model)
    xl_failed: bool = False  # the handout's XL model was in the run but its rows cannot answer (out of memory)


def _for_handout(df: pd.DataFrame, handout: str, usable=lambda rows: True) -> _Rows:
    """The rows of `df` for `handout`: its XL model's where `usable(rows)`, else the 2025 XL's, else the first
    usable size's (in the run's order); a table without a size column is one model's, returned whole."""
    if "size" not in df.columns or df.empty:
        return _Rows(df, None)
    sizes = list(dict.fromkeys(df["size"].astype(str)))
    by_size = {s: df[df["size"].astype(str) == s].reset_index(drop=True) for s in sizes}
    order = sorted(sizes, key=lambda s: (not _is_xl(s, handout), not _is_xl(s, "2025")))
    ran_xl = any(_is_xl(s, handout) for s in sizes)
    for s in order:
        if usable(by_size[s]):
            return _Rows(by_size[s], s, ran_xl and not _is_xl(s, handout))
    return _Rows(by_size[order[0]], order[0])


def _ok_with(names: tuple[str, ...], key: str = "flavour"):
    """A `usable` test: every one of `names` has an ok row."""
    return lambda rows: set(names) <= set(rows.loc[rows.get("status", pd.Series("ok", index=rows.index)) == "ok", key])


def _short_name(size: str) -> str:
    """'2025 XL', '2026 xl' or the library's name, for a table column."""
    return "2025 XL" if _is_xl(size, "2025") else "2026 xl" if _is_xl(size, "2026") else str(size)


def _model_phrase(size: str, params: float | None = None) -> str:
    shape = _model_shape(size, params)
    return f"{_model_name(size)} ({shape})" if shape else _model_name(size)


@dataclass
class Setup:
    """What a notebook's benchmark ran: the model, the batch, the ranks and where they ran."""

    size: str
    world_size: int
    backend: str
    hardware: str  # e.g. 'NVIDIA H200' or '' when the machine is not named
    parameters: float | None = None
    context_length: int | None = None
    global_batch_size: int | None = None
    warmup: int | None = None
    steps: int | None = None

    @property
    def on_gpus(self) -> bool:
        return self.backend == "nccl"

    @property
    def ranks(self) -> str:
        if self.on_gpus:
            return f"{self.world_size} {self.hardware + ' ' if self.hardware else ''}GPUs (NCCL)"
        return f"{self.world_size} CPU processes (gloo)"

    @property
    def gradient_bytes(self) -> float:
        from cs336_systems.accounting.sharding import setup_for_model
        from cs336_systems.model import ModelConfig

        params = self.parameters or setup_for_model(ModelConfig.from_size(self.size), 2).num_params
        return 4.0 * params

    def describe(self) -> str:
        batch = ""
        if self.global_batch_size and self.context_length:
            batch = (
                f", a global batch of {self.global_batch_size} sequences of {self.context_length} tokens "
                f"({self.global_batch_size // self.world_size} per rank)"
            )
        steps = (
            f", mean of {self.steps} steps after {self.warmup} warm-up step{'s' * (self.warmup != 1)}"
            if self.steps
            else ""
        )
        return f"{_model_phrase(self.size, self.parameters)} in fp32 with AdamW on {self.ranks}{batch}{steps}"


def _hardware(results: Results, notebook: str) -> str:
    name = results.gpu_name(notebook)
    return (
        name.split("×", 1)[1].strip() if "×" in name else name.removeprefix("one ").strip() if "NVIDIA" in name else ""
    )


def _headline_note(results: Results, notebook: str) -> tuple[str, int | None, str] | None:
    """(size, ranks, backend) from a note like 'xl, 2 ranks, nccl' of the notebook's headline records."""
    try:
        records = results.json("headlines")
    except NotAnswered:
        return None
    for r in records:
        m = re.match(r"^([\w.]+), (?:(\d+) ranks, )?(nccl|gloo)\b", str(r.get("note", "")))
        if r.get("notebook") == notebook and m:
            return m.group(1), int(m.group(2)) if m.group(2) else None, m.group(3)
    return None


def _setup(
    results: Results, notebook: str, table: str, world_size: int | None = None, size: str | None = None
) -> Setup:
    """The run's setting from `table` (the notebook's setup table; its row for `size` where it has one per
    model), else its headline note."""
    hardware = _hardware(results, notebook)
    if results.has(table):
        t = results.table(table)
        match = t[t["size"].astype(str) == size] if size is not None and "size" in t else t.iloc[0:0]
        r = (match if len(match) else t).iloc[0]
        get = lambda col, kind=int: kind(r[col]) if col in r and pd.notna(r[col]) else None  # noqa: E731
        return Setup(
            size=str(r["size"]),
            world_size=int(r["world_size"]),
            backend=str(r["backend"]),
            hardware=hardware,
            parameters=get("parameters", float),
            context_length=get("context_length"),
            global_batch_size=get("global_batch_size"),
            warmup=get("warmup"),
            steps=get("steps"),
        )
    note = _headline_note(results, notebook)
    if note is None:
        raise NotAnswered(f"this run records neither a `{table}` table nor a headline naming its model and backend")
    size, ranks, backend = note
    ranks = ranks or world_size
    if ranks is None:
        raise NotAnswered(f"this run does not record how many ranks `{table}` used")
    return Setup(size=size, world_size=ranks, backend=backend, hardware=hardware)


def _run_caveat(setup: Setup, handout: str = "2025", xl_failed: bool = False) -> str:
    """What the run leaves out of the handout's setting: GPUs, and the handout's XL model (2026 always, 2025 on
    GPUs, where the CPU sentence does not already say it); `xl_failed`: that model ran out of memory."""
    parts = []
    if not setup.on_gpus:
        parts.append(
            f"This run is the CPU profile: {_model_phrase(setup.size, setup.parameters)} on "
            f"{setup.ranks}, not the handout's XL model on two GPUs; its times show the method, not GPU costs."
        )
    if not _is_xl(setup.size, handout) and (handout == "2026" or setup.on_gpus):
        xl = ("its xl model", XL_2026) if handout == "2026" else ("its XL model", "xl")
        why = "which ran out of memory on these GPUs in this run" if xl_failed else "which this run does not include"
        parts.append(
            f"The {handout} handout asks for {xl[0]} ({_model_shape(xl[1])}), {why}: these numbers are for "
            f"{_model_phrase(setup.size, setup.parameters)}."
        )
    return " ".join(parts)


def _steps_table(df: pd.DataFrame, names: dict[str, str]) -> pd.DataFrame:
    """The step-phase columns of a DDP step table, renamed for a reader."""
    columns = {
        "step_ms": "step (ms)",
        "step_std_ms": "± std (ms)",
        "fwd_bwd_ms": "forward+backward (ms)",
        "sync_ms": "gradient communication after backward (ms)",
        "optimizer_ms": "optimizer step (ms)",
        "all_reduce_calls": "all-reduce calls",
    }
    rows = df[df.flavour.isin(names)].copy()
    rows.insert(0, "DDP", rows.flavour.map(names))
    rows = rows[["DDP", *[c for c in columns if c in rows]]].rename(columns=columns)
    return rows.round(1).reset_index(drop=True)


def _ok(df: pd.DataFrame) -> pd.DataFrame:
    return df[df.status == "ok"].set_index("flavour") if "status" in df else df.set_index("flavour")


def _need(ok: pd.DataFrame, names: tuple[str, ...], what: str) -> None:
    missing = [n for n in names if n not in ok.index]
    if missing:
        raise NotAnswered(f"{', '.join(missing)} did not run in this {what} benchmark")


# ---------------------------------------------------------------- 12: all-reduce


def _size_bytes(label: str) -> float:
    number, unit = label.split()
    return float(number) * {"kB": 1e3, "MB": 1e6, "GB": 1e9}[unit]


def _ring(n: int) -> float:
    """Bytes a rank sends in a ring all-reduce, per byte of the tensor."""
    return 2 * (n - 1) / n


def _per_call_cost(g: pd.DataFrame) -> tuple[float, float]:
    """(α in ms, α's share of the smallest size's time) from time = α + S/β through the two smallest sizes
    at the fewest processes."""
    n = g[g.world_size == g.world_size.min()].sort_values("bytes")
    if len(n) < 2:
        return math.nan, math.nan
    (s1, t1), (s2, t2) = n[["bytes", "mean_ms"]].iloc[:2].to_numpy()
    alpha = max((t1 * s2 - t2 * s1) / (s2 - s1), 0.0)
    return alpha, alpha / t1


def _backend_sentence(g: pd.DataFrame, backend: str, where: str) -> str:
    g = g.assign(bytes=g["size"].map(_size_bytes))
    small, large = g[g.bytes == g.bytes.min()], g[g.bytes == g.bytes.max()].sort_values("world_size")
    lo, hi = large.iloc[0], large.iloc[-1]
    alpha, share = _per_call_cost(g)
    text = (
        f"{backend} on {where}: a {small['size'].iloc[0]} all-reduce takes {_ms(small.mean_ms.min())} to "
        f"{_ms(small.mean_ms.max())} at {small.world_size.min()} to {small.world_size.max()} processes, at most "
        f"{small.busbw_gbps.max():.2f} GB/s of bus bandwidth, while {lo['size']} reaches "
        f"{large.busbw_gbps.max():.2f} GB/s"
    )
    if share == share and share < 0.05:
        text += (
            f" (at {int(g.world_size.min())} processes the two smallest sizes take times in proportion to their "
            "bytes: no measurable per-call cost)"
        )
    elif share == share:
        text += (
            f" (time = α + S/β through the two smallest sizes at {int(g.world_size.min())} processes gives a "
            f"per-call cost α of {_ms(alpha)}, {pct(share)} of the {small['size'].iloc[0]} time)"
        )
    if len(large) > 1:
        text += (
            f"; at {lo['size']} the time goes from {_ms(lo.mean_ms)} with {lo.world_size} processes to "
            f"{_ms(hi.mean_ms)} with {hi.world_size}, {_x(hi.mean_ms / lo.mean_ms)}, while the ring's traffic per "
            f"rank grows {_x(_ring(hi.world_size) / _ring(lo.world_size))}"
        )
    return text + "."


@builds("distributed_communication_single_node")
def allreduce(results: Results) -> Answer:
    """All-reduce time and bandwidth over sizes, process counts and backends (figure)."""
    df = results.table("allreduce")
    hardware = _hardware(results, NB_ALLREDUCE)
    where = {"gloo": "the CPU", "nccl": f"{hardware} GPUs" if hardware else "GPUs"}
    label = {"gloo": "Gloo", "nccl": "NCCL"}
    text = " ".join(_backend_sentence(g, label.get(b, b), where.get(b, b)) for b, g in df.groupby("backend"))
    shared = df.groupby("backend")["size"].apply(set)
    if {"gloo", "nccl"} <= set(shared.index) and (both := shared["gloo"] & shared["nccl"]):
        size = max(both, key=_size_bytes)
        at = df[df["size"] == size].groupby("backend").busbw_gbps.max()
        text += (
            f" At {size}, NCCL sustains {at['nccl'] / at['gloo']:,.0f}× gloo's best bus bandwidth "
            f"({at['nccl']:.1f} against {at['gloo']:.2f} GB/s): more processes add ring steps for both, but gloo's "
            "processes also share the host's cores and memory bandwidth."
        )
    caveats = []
    if "nccl" not in set(df.backend):
        caveats.append(
            "This run had no GPUs, so only gloo on CPU processes ran; the NCCL rows need a machine with GPUs."
        )
    sizes = sorted(df["size"].unique(), key=_size_bytes)
    if max(_size_bytes(x) for x in sizes) < 1e9:
        caveats.append(f"Sizes measured: {', '.join(sizes)} (the handout's go up to 1 GB).")
    return Answer(text=text, figure=results.figure("allreduce_time_and_bandwidth"), caveat=" ".join(caveats))


# ---------------------------------------------------------------- 13, 14, 15: correctness checks


def _equivalence(results: Results, table: str, flavours: tuple[str, ...]) -> pd.DataFrame | None:
    """The notebook's equivalence rows for `flavours` (name prefixes), from its own table or the shared one."""
    for name in (table, "equivalence"):
        if results.has(name):
            df = results.table(name)
            rows = df[df.flavour.map(lambda f: any(str(f).startswith(p) for p in flavours))]
            if len(rows):
                return rows.reset_index(drop=True)
    return None


def _headline_value(results: Results, notebook: str, key: str) -> str | None:
    try:
        records = results.json("headlines")
    except NotAnswered:
        return None
    return next((str(r["value"]) for r in records if r.get("notebook") == notebook and r.get("key") == key), None)


def _where(results: Results, notebook: str, ranks: int | None, setup_table: str) -> str:
    """'2 NVIDIA H200 GPUs (NCCL)' or '2 CPU processes (gloo)': the backend from the notebook's setup table, else
    from whether its machine has GPUs."""
    hardware = _hardware(results, notebook)
    on_gpus = bool(hardware)
    if results.has(setup_table):
        on_gpus = str(results.table(setup_table)["backend"].iloc[0]) == "nccl"
    count = f"{ranks} " if ranks else ""
    return f"{count}{hardware + ' ' if hardware else ''}GPUs (NCCL)" if on_gpus else f"{count}CPU processes (gloo)"


def _check_table(rows: pd.DataFrame) -> pd.DataFrame:
    cols = {
        "model": "model",
        "flavour": "DDP",
        "buckets": "buckets",
        "max_abs_diff": "largest weight difference",
        "max_update": "largest weight update",
        "matches": "equal (≤ 1e-5)",
    }
    return rows[[c for c in cols if c in rows and rows[c].notna().any()]].rename(columns=cols)


def _code_answer(
    results: Results,
    notebook: str,
    location: str,
    table: str,
    flavours: tuple[str, ...],
    what: str,
    headline: str,
    setup_table: str,
) -> Answer:
    """Where the code is, then what the notebook's equivalence check measured (or, failing its table, counted)."""
    rows = _equivalence(results, table, flavours)
    checked = rows[~rows.flavour.eq("no-communication")] if rows is not None else None
    if checked is not None and len(checked):
        control = rows[rows.flavour.eq("no-communication")]
        text = (
            f"{location} On {_where(results, notebook, int(checked.ranks.iloc[0]), setup_table)}, "
            f"{int(checked.matches.sum())} "
            f"of {len(checked)} {what} ended 5 SGD steps with the weights of one process trained on the whole batch, "
            f"on every rank: the largest difference was {checked.max_abs_diff.max():.1e} while the weights moved by "
            f"up to {checked.max_update.max():.3g}, and since rank 1 started from other weights (up to "
            f"{checked.diff_before_wrap.max():.3g} apart) the check also covers the initial broadcast."
        )
        if len(control):
            text += (
                f" The same wrapper without the all-reduce ends {control.max_abs_diff.min():.3g} to "
                f"{control.max_abs_diff.max():.3g} away, so the check catches a missing average."
            )
        return Answer(text=text, table=_check_table(checked))
    count = _headline_value(results, notebook, headline)
    if count is None:
        raise NotAnswered(f"this run records no equivalence check for {what}")
    matched, total = (count.split("/") + [""])[:2]
    note = _headline_note(results, notebook)
    text = (
        f"{location} On {_where(results, notebook, note[1] if note else None, setup_table)}, {matched} of {total} "
        f"{what} ended "
        "their training steps with the weights of one process trained on the whole batch, on every rank."
    )
    return Answer(
        text=text,
        caveat="This report's results keep only the count of matching models for this check; "
        "the weight differences are shown on the notebook's page.",
    )


@builds("naive_ddp")
def naive_ddp(results: Results) -> Answer:
    """Where naive DDP is, and the equivalence check the run made."""
    location = (
        "`cs336_systems.distributed.DDPNaive` (file `distributed/ddp_naive.py`) wraps an unchanged model, "
        "broadcasts rank 0's weights at construction and, after `backward()`, all-reduces each parameter's "
        "gradient and divides it by the world size; `DDPFlat` does the same with one all-reduce of the "
        "flattened gradients."
    )
    return _code_answer(
        results,
        NB_NAIVE,
        location,
        "equivalence_naive",
        ("naive", "flat", "no-communication"),
        "(model, flavour) pairs (naive and flat DDP on a toy model, a toy model with a tied weight, a "
        "frozen parameter and a buffer, and a small Transformer)",
        "naive+flat DDP match single-process training",
        "naive_flat_setup",
    )


@builds("ddp_overlap_individual_parameters")
def ddp_individual(results: Results) -> Answer:
    """Where overlapping per-parameter DDP is, and its equivalence check."""
    location = (
        "`cs336_systems.distributed.DDPIndividualParameters` (file `distributed/ddp_individual.py`) broadcasts "
        "rank 0's weights and registers `register_post_accumulate_grad_hook` on every trainable parameter, which "
        "launches an asynchronous all-reduce of the gradient as soon as autograd has accumulated it; "
        "`finish_gradient_synchronization()` waits for the calls still in flight and divides by the world size."
    )
    return _code_answer(
        results,
        NB_INDIVIDUAL,
        location,
        "equivalence_individual",
        ("individual",),
        "models (a toy model, a toy model with a tied weight, a frozen parameter and a buffer, and a "
        "small Transformer)",
        "individual-parameter DDP matches single-process training",
        "overlap_individual_setup",
    )


@builds("ddp_overlap_bucketed")
def ddp_bucketed(results: Results) -> Answer:
    """Where bucketed DDP is, and its equivalence check over bucket sizes."""
    location = (
        "`cs336_systems.distributed.DDPBucketed(module, bucket_size_mb)` (file `distributed/ddp_bucketed.py`) "
        "packs the parameters, in reverse registration order, into buckets of at most `bucket_size_mb`; a hook "
        "copies each gradient into its bucket's flat buffer when it is ready and launches the bucket's "
        "asynchronous all-reduce once its last gradient has arrived, and the gradients are views into the "
        "buckets, so `finish_gradient_synchronization()` only waits."
    )
    answer = _code_answer(
        results,
        NB_BUCKETED,
        location,
        "equivalence_bucketed",
        ("bucketed",),
        "(model, bucket cap) pairs",
        "bucketed DDP matches single-process training",
        "all_flavours_setup",
    )
    if answer.table is not None:
        b = answer.table["buckets"]
        answer.text += f" The caps tried split the models into {int(b.min())} to {int(b.max())} buckets."
    return answer


# ---------------------------------------------------------------- 13: naive and flat DDP timed


def _naive_flat(results: Results, handout: str) -> tuple[Setup, pd.DataFrame, pd.DataFrame, bool]:
    """The setting, the step rows and the ok rows by flavour of `handout`'s model, and whether its XL failed."""
    needed = ("no-communication", "naive", "flat")
    pick = _for_handout(results.table("naive_flat_step"), handout, _ok_with(needed))
    setup = _setup(results, NB_NAIVE, "naive_flat_setup", size=pick.size)
    ok = _ok(pick.rows)
    _need(ok, needed, "DDP")
    return setup, pick.rows, ok, pick.xl_failed


@builds_each_handout("naive_ddp_benchmarking")
def _naive_benchmarking(results: Results, handout: str) -> Answer:
    setup, df, ok, xl_failed = _naive_flat(results, handout)
    base, naive = ok.loc["no-communication"], ok.loc["naive"]
    text = (
        f"Setup: {setup.describe()}; every step is split into forward+backward, gradient communication and the "
        f"optimizer step, with a device synchronize between them, and the same step without communication is the "
        f"baseline. Naive DDP, one all-reduce per parameter tensor ({int(naive.all_reduce_calls)} calls) after the "
        f"backward pass, takes {_ms(naive.step_ms)} ± {naive.step_std_ms:.1f} ms per training step, of which "
        f"{_ms(naive.sync_ms)} ({pct(naive.sync_fraction)}) is spent communicating gradients; the baseline step "
        f"takes {_ms(base.step_ms)}.{_noise_note(base, {'naive DDP': naive})}"
    )
    table = _steps_table(df, {"no-communication": "no communication (baseline)", "naive": "naive (per parameter)"})
    return Answer(text=text, table=table, caveat=_run_caveat(setup, handout, xl_failed))


@builds_each_handout("minimal_ddp_flat_benchmarking")
def _flat_benchmarking(results: Results, handout: str) -> Answer:
    setup, df, ok, xl_failed = _naive_flat(results, handout)
    naive, flat = ok.loc["naive"], ok.loc["flat"]
    calls = naive.all_reduce_calls - flat.all_reduce_calls
    saved = naive.sync_ms - flat.sync_ms
    text = (
        f"With one all-reduce of all {_bytes(setup.gradient_bytes)} of flattened gradients, a step of "
        f"{_model_name(setup.size)} on {setup.ranks} takes {_ms(flat.step_ms)} ± {flat.step_std_ms:.1f} ms, of which "
        f"{_ms(flat.sync_ms)} ({pct(flat.sync_fraction)}) is communication, against {_ms(naive.step_ms)} ± "
        f"{naive.step_std_ms:.1f} ms and {_ms(naive.sync_ms)} with {int(naive.all_reduce_calls)} per-parameter "
        f"all-reduces: the flat step is {_x(flat.step_ms / naive.step_ms)} the naive one. "
    )
    if saved > 0:
        per_call = saved / calls
        text += (
            f"Batching saves {_ms(saved)} of communication per step, about "
            + (f"{per_call * 1e3:.0f} µs" if per_call < 1 else _ms(per_call))
            + " per call avoided (net of the copies into and out of the flat buffer)"
            + (
                ", small next to the time to move the bytes, which both must do after the backward pass."
                if saved < 0.2 * naive.sync_ms
                else ": here the per-call cost is a large part of naive's communication."
            )
        )
    else:
        text += (
            f"Batching saves no communication time here: the single all-reduce takes {_ms(flat.sync_ms)} against "
            f"{_ms(naive.sync_ms)} for the per-parameter calls."
        )
    text += _spread_note([("the flat and naive steps", flat, naive)])
    table = _steps_table(
        df,
        {
            "no-communication": "no communication (baseline)",
            "naive": "naive (per parameter)",
            "flat": "flat (one all-reduce)",
        },
    )
    return Answer(text=text, table=table, caveat=_run_caveat(setup, handout, xl_failed))


# ---------------------------------------------------------------- 14: overlapping individual all-reduces


@builds_each_handout("ddp_overlap_individual_parameters_benchmarking.a")
def _individual_benchmarking(results: Results, handout: str) -> Answer:
    needed = ("no-communication", "naive", "flat", "individual")
    pick = _for_handout(results.table("overlap_individual_step"), handout, _ok_with(needed))
    df = pick.rows
    setup = _setup(results, NB_INDIVIDUAL, "overlap_individual_setup", size=pick.size)
    ok = _ok(df)
    _need(ok, needed, "DDP")
    base, naive, flat, ind = (ok.loc[k] for k in ("no-communication", "naive", "flat", "individual"))
    grew = ind.fwd_bwd_ms - base.fwd_bwd_ms
    text = (
        f"With {setup.describe()}, overlapping per-parameter all-reduces with the backward pass gives a step of "
        f"{_ms(ind.step_ms)} ± {ind.step_std_ms:.1f} ms: {_x(ind.step_ms / naive.step_ms)} naive DDP's "
        f"{_ms(naive.step_ms)} ± {naive.step_std_ms:.1f} ms and {_x(ind.step_ms / flat.step_ms)} flat DDP's "
        f"{_ms(flat.step_ms)} ± {flat.step_std_ms:.1f} ms, with {_ms(base.step_ms)} for the step without "
        f"communication. {'Only ' if ind.sync_ms < min(naive.sync_ms, flat.sync_ms) else ''}{_ms(ind.sync_ms)} of "
        f"communication is left after the backward pass (naive "
        f"{_ms(naive.sync_ms)}, flat {_ms(flat.sync_ms)}); the forward+backward phase "
        + (
            f"grows by {_ms(grew)} ({_ms(base.fwd_bwd_ms)} → {_ms(ind.fwd_bwd_ms)}) as the all-reduces launched "
            "from the hooks run alongside the backward computation, which takes back most of what the overlap hides."
            if grew > 0.5 * (naive.sync_ms - ind.sync_ms)
            else f"grows by only {_ms(grew)} ({_ms(base.fwd_bwd_ms)} → {_ms(ind.fwd_bwd_ms)})."
            if grew > 0
            else f"does not grow ({_ms(base.fwd_bwd_ms)} → {_ms(ind.fwd_bwd_ms)})."
        )
        + _spread_note([("overlapping against naive", ind, naive), ("overlapping against flat", ind, flat)])
        + _noise_note(base, {"naive": naive, "flat": flat, "overlapping DDP": ind})
    )
    table = _steps_table(
        df,
        {
            "no-communication": "no communication (baseline)",
            "naive": "naive (per parameter)",
            "flat": "flat (one all-reduce)",
            "individual": "overlapping, per parameter",
        },
    )
    return Answer(text=text, table=table, caveat=_run_caveat(setup, handout, pick.xl_failed))


@builds_each_handout("ddp_overlap_individual_parameters_benchmarking.b")
def _timelines(results: Results, handout: str) -> Answer:
    pick = _for_handout(results.table("timeline_overlap"), handout, _ok_with(("naive", "individual")))
    o = pick.rows.set_index("flavour")
    if not {"naive", "individual"} <= set(o.index):
        raise NotAnswered("this run did not profile both the naive and the overlapping step")
    setup = _setup(results, NB_INDIVIDUAL, "overlap_individual_setup", size=pick.size)
    naive, ind = o.loc["naive"], o.loc["individual"]
    lanes = "CUDA stream" if setup.on_gpus else "gloo threads"
    text = (
        f"In one profiled step of each on rank 0 ({_model_name(setup.size)}, {setup.ranks}), "
        f"{pct(naive.share_inside_backward)} of naive DDP's all-reduce time ({int(naive.communication_spans)} calls) "
        f"falls inside the backward pass and its last all-reduce ends {_ms(naive.after_backward_ms)} after it, while "
        f"{pct(ind.share_inside_backward)} of the overlapping DDP's ({int(ind.communication_spans)} calls) runs "
        f"during the backward pass, on its own {lanes} beside the compute, and its last ends "
        f"{_ms(ind.after_backward_ms)} after it."
    )
    caveat = (
        "The two timelines are drawn from torch.profiler traces of one step each, not Nsight Systems screenshots; "
        "the profiler slows a step, so these times are longer than the benchmark's."
    )
    figure = f"timeline_naive_vs_individual_{pick.size}"  # one figure per size; runs of one size drew one unnamed
    figure = results.figure(
        figure
        if pick.size is not None and (results.folder / f"figures/{figure}.png").exists()
        else "timeline_naive_vs_individual"
    )
    return Answer(text=text, figure=figure, caveat=f"{caveat} {_run_caveat(setup, handout, pick.xl_failed)}".strip())


# ---------------------------------------------------------------- 15: bucketed DDP


def _cap_mb(label: str) -> float:
    """The bucket cap of a flavour label ('bucketed 100 MB, tail 256 MB' -> 100); one bucket is infinite."""
    m = re.match(r"bucketed ([\d.e+-]+) MB", label)
    return float(m.group(1)) if m else math.inf


def _bucket_label(label: str) -> str:
    """'bucketed 1000 MB, tail 256 MB' -> 'the 1000 MB cap with a separate final bucket of 256 MB'."""
    m = re.search(r"tail ([\d.e+-]+) MB", label)
    cap = _cap_mb(label)
    name = "one bucket" if cap == math.inf else f"the {cap:g} MB cap"
    return name + (f" with a separate final bucket of {float(m.group(1)):g} MB" if m else "")


def _buckets(n: float) -> str:
    return f"{int(n)} bucket{'s' * (int(n) != 1)}"


def _bucket_commentary(base: pd.Series, ind: pd.Series, flat: pd.Series, best: pd.Series, plain: pd.DataFrame) -> str:
    """Expectation against result, worded only as far as the steps' spread lets the run separate them."""
    expected = (
        "We expected buckets to beat both per-parameter overlap (many small calls) and flat DDP (nothing "
        "overlapped), with the best cap between the extremes. "
    )
    separated = [
        name
        for name, r in (("per-parameter overlap", ind), ("flat DDP", flat))
        if best.step_ms < r.step_ms and not _inside_spread(best.step_ms, best.step_std_ms, r.step_ms, r.step_std_ms)
    ]
    if len(separated) == 2:
        text = expected + "The best bucketed step beats both by more than the steps' spread"
    elif separated:
        text = (
            expected + f"The best bucketed step beats {separated[0]} by more than the steps' spread, but not the other"
        )
    else:
        return (
            expected + f"This run's step-to-step spread (±{best.step_std_ms:.1f} ms for the best) is as large as the "
            "differences, so it shows neither that result nor how the bucket size trades off."
        )
    if len(plain) < 2:
        return text + "."
    small, large = plain.iloc[0], plain.iloc[-1]
    if not (small.fwd_bwd_ms > large.fwd_bwd_ms > base.fwd_bwd_ms and large.sync_ms > small.sync_ms):
        return text + "; the two ends of the sweep do not show a clear trade-off in this run."
    return text + (
        f", and the two ends of the sweep trade off as the overhead model of (b) says: the {_cap_mb(small.name):g} "
        f"MB cap slows forward+backward to {_ms(small.fwd_bwd_ms)} ({_ms(base.fwd_bwd_ms)} without "
        f"communication) and leaves {_ms(small.sync_ms)} of communication after it, the "
        f"{_cap_mb(large.name):g} MB cap {_ms(large.fwd_bwd_ms)} and {_ms(large.sync_ms)}. Unlike the model, "
        "the cost of small buckets shows up as a slower backward pass (the copies into the buckets and the "
        "all-reduces running beside the backward kernels) rather than as per-call latency after it; slower "
        "links (several nodes), more ranks or less compute per rank would make exposed communication the "
        "larger term and favour smaller buckets."
    )


def _close_note(labels: list[str]) -> str:
    """' (the 2000 and 4000 MB caps with the same final bucket are within the steps' spread of it)'."""
    if not labels:
        return ""
    if len(labels) > 2:
        return f" ({len(labels)} other configurations are within the steps' spread of it)"
    tails = {re.sub(r"^bucketed [^,]+", "", k) for k in labels}
    caps = " and ".join(f"{_cap_mb(k):g}" for k in labels)
    if len(tails) == 1:
        tail = tails.pop()
        same = " with the same final bucket" if tail else ""
        return (
            f" (the {caps} MB caps{same} are within the steps' spread of it)"
            if len(labels) > 1
            else f" (the {caps} MB cap{same} is within the steps' spread of it)"
        )
    return f" ({' and '.join(_bucket_label(k) for k in labels)} are within the steps' spread of it)"


@builds("ddp_bucketed_benchmarking.a")
def bucketed_benchmarking(results: Results) -> Answer:
    """Step time per bucket size next to every other flavour and PyTorch's DDP (table)."""
    df = results.table("all_flavours")
    setup = _setup(results, NB_BUCKETED, "all_flavours_setup")
    ok = _ok(df)
    _need(ok, ("no-communication", "naive", "flat", "individual", "torch-ddp"), "DDP")
    sweep = ok[ok.index.str.startswith("bucketed") & ~ok.index.str.contains("CTAs")]
    if sweep.empty:
        raise NotAnswered("no bucketed configuration ran")
    plain = sweep[~sweep.index.str.contains("tail")]
    plain = plain.iloc[np.argsort([_cap_mb(k) for k in plain.index])]
    base, naive, flat, ind, tddp = (ok.loc[k] for k in ("no-communication", "naive", "flat", "individual", "torch-ddp"))
    best = sweep.loc[sweep.step_ms.idxmin()]
    close = [
        k
        for k, r in sweep.iterrows()
        if k != best.name and _inside_spread(r.step_ms, r.step_std_ms, best.step_ms, best.step_std_ms)
    ]
    caps = ", ".join(
        f"{_ms(r.step_ms)} at {_cap_mb(k):g} MB ({_buckets(r.all_reduce_calls)})" for k, r in plain.iterrows()
    )
    text = (
        f"With {setup.describe()}, a bucketed step takes {caps}, against {_ms(ind.step_ms)} with per-parameter "
        f"overlap, {_ms(flat.step_ms)} flat, {_ms(naive.step_ms)} naive, {_ms(tddp.step_ms)} for PyTorch's "
        f"DistributedDataParallel and {_ms(base.step_ms)} without communication. "
    )
    text += (
        f"The fastest configuration, {_bucket_label(best.name)}, takes {_ms(best.step_ms)} ± {best.step_std_ms:.1f} "
        f"ms, {_x(best.step_ms / tddp.step_ms)} DistributedDataParallel's step in the same run{_close_note(close)}. "
    )
    text += _bucket_commentary(base, ind, flat, best, plain)
    text += _noise_note(
        base, {"naive": naive, "flat": flat, "per-parameter overlap": ind, "the best bucketed step": best}
    )
    cols = {
        "all_reduce_calls": "all-reduce calls",
        "step_ms": "step (ms)",
        "step_std_ms": "± std (ms)",
        "fwd_bwd_ms": "forward+backward (ms)",
        "sync_ms": "communication after backward (ms)",
    }
    names = {
        "no-communication": "no communication",
        "naive": "naive",
        "flat": "flat",
        "individual": "per-parameter overlap",
        "torch-ddp": "PyTorch DistributedDataParallel",
    }
    rows = pd.concat([ok.loc[list(names)], plain, sweep.drop(index=plain.index)])
    rows.index = [
        names.get(k, k.replace("bucketed ", "bucket cap ").replace(", tail", ", final bucket")) for k in rows.index
    ]
    table = rows[list(cols)].rename(columns=cols).rename_axis("DDP").reset_index().round(1)
    return Answer(text=text, table=table, caveat=_run_caveat(setup))


@builds("ddp_bucketed_benchmarking.b")
def bucketed_overhead_model(results: Results) -> Answer:
    """The overhead model, its optimum, and its fit to the run (derivation + table)."""
    text = (
        "Split the s bytes of gradients into n_b equal buckets; computing one bucket's gradients takes as long "
        "as communicating it, τ = s / (n_b·w), and each all-reduce also costs o, so bucket k is ready at k·τ "
        "and, the calls running one after another, ends at (k + 1)·τ + k·o; the backward pass ends at n_b·τ, so "
        "the overhead after it is **overhead(n_b) = s / (n_b·w) + n_b·o**. Setting its derivative "
        "−s / (n_b²·w) + o to zero gives n_opt = √(s / (w·o)), i.e. the optimal bucket size "
        "**b_opt = s / n_opt = √(s·w·o)**, with the least overhead 2·√(s·o / w)."
    )
    table = None
    caveat = ""
    if results.has("overhead_model_fit"):
        fit = results.table("overhead_model_fit")
        setup = _setup(results, NB_BUCKETED, "all_flavours_setup")
        n, y, model = (
            fit.all_reduce_calls.to_numpy(float),
            fit.overhead_ms.to_numpy(float),
            fit.model_ms.to_numpy(float),
        )
        # the fitted model is a/n + o·n; two of its points give a = s/w and o
        (a, o), *_ = np.linalg.lstsq(np.column_stack([1 / n, n]), model, rcond=None)
        r2 = 1 - np.sum((y - model) ** 2) / np.sum((y - y.mean()) ** 2) if np.ptp(y) > 0 else 1.0
        s = setup.gradient_bytes
        flavours = _ok(results.table("all_flavours")) if results.has("all_flavours") else None
        sweep = (
            flavours[flavours.index.str.startswith("bucketed")] if flavours is not None else fit.set_index("flavour")
        )
        best_cap = _cap_mb(sweep.step_ms.idxmin() if "step_ms" in sweep else sweep.overhead_ms.idxmin())
        text += (
            " Fitted by least squares to this run's overheads (step minus the no-communication step) with s = "
            f"{_bytes(s)}: "
        )
        if a > 0 and o > 0:
            text += (
                f"o = {o * 1e3:.1f} µs, w = {_rate(s / (a / 1e3))}, so b_opt = "
                f"{math.sqrt(s * s / (a / 1e3) * o / 1e3) / 2**20:,.3g} MB (MB = 2^20 bytes, as for the caps; "
                f"{math.sqrt(a / o):.1f} buckets), against the measured best cap of {best_cap:g} MB; "
            )
        else:
            bound = (
                "neither a positive per-call cost nor a bandwidth term comes out"
                if o <= 0 and a <= 0
                else "the per-call cost comes out at zero"
                if o <= 0
                else "the bandwidth term comes out at zero"
            )
            text += f"{bound}, so the model has no interior optimum here (the measured best cap is {best_cap:g} MB); "
        text += (
            f"R² = {r2:.2f}: the model fits these overheads {'worse than' if r2 < 0 else 'hardly better than'} their "
            "mean, as what it leaves out (the slower backward pass under concurrent all-reduces and bucket copies, "
            "and step-to-step noise) outweighs o and w."
            if r2 < 0.5
            else f"R² = {r2:.2f}."
        )
        table = fit.rename(
            columns={
                "flavour": "DDP",
                "all_reduce_calls": "buckets (n_b)",
                "overhead_ms": "measured overhead (ms)",
                "model_ms": "model (ms)",
            }
        ).round(1)
        caveat = _run_caveat(setup)
    return Answer(text=text, table=table, caveat=caveat)


# ---------------------------------------------------------------- 16: optimizer state sharding


def _sharding_setup(results: Results, size: str | None = None) -> Setup:
    ranks = None
    if results.has("sharding_memory_breakdown"):
        ranks = int(results.table("sharding_memory_breakdown")["rank"].nunique())
    return _setup(results, NB_SHARDING, "sharding_setup", world_size=ranks, size=size)


def _agreement(differences: dict[str, float], reference: str) -> str:
    """'X and Y are bit-identical to REF' where the largest difference is 0, else 'X differ(s) from REF by at
    most D'; one clause per group, in the order given."""
    same = [name for name, d in differences.items() if d == 0]
    apart = [f"{name} differ from {reference} by at most {d:.1e}" for name, d in differences.items() if d != 0]
    clauses = ([f"{and_join(same)} are bit-identical to {reference}"] if same else []) + apart
    return and_join(clauses) + "."


@builds("optimizer_state_sharding")
def optimizer_state_sharding(results: Results) -> Answer:
    """Where the sharded optimizer is, and its equality with AdamW."""
    eq = results.table("sharding_equality")
    worst = eq.groupby("optimizer", sort=False).agg(
        max_abs_diff=("max_abs_diff", "max"), max_update=("max_update", "max")
    )
    where = _where(results, NB_SHARDING, eq["rank"].nunique(), "sharding_setup")
    text = (
        "`cs336_systems.distributed.ShardedOptimizer(params, optimizer_cls, **kwargs)` (module "
        "`sharded_optimizer`) calls the `torch.optim.Optimizer` constructor, and its `add_param_group` assigns every "
        "parameter to one rank (largest first, to the least-loaded rank); each rank's wrapped optimizer holds state "
        "for its own parameters only, and `step()` updates them and then sends every parameter from its owner to the "
        "other ranks. "
        f"On {where}, after {int(eq.steps.iloc[0])} AdamW steps on the {eq['size'].iloc[0]} model (the weights moved "
        f"by up to {worst.max_update.max():.3g}), "
        + _agreement(
            {
                "the sharded optimizer's weights": worst.max_abs_diff.get("sharded", float("nan")),
                "PyTorch's ZeroRedundancyOptimizer's": worst.max_abs_diff.get("zero", float("nan")),
            },
            "the unsharded AdamW's",
        )
    )
    names = {
        "unsharded": "AdamW (unsharded)",
        "sharded": "ShardedOptimizer(AdamW)",
        "zero": "ZeroRedundancyOptimizer(AdamW)",
    }
    table = (
        worst.rename(index=names)
        .rename_axis("optimizer")
        .reset_index()
        .rename(
            columns={"max_abs_diff": "largest weight difference from unsharded", "max_update": "largest weight update"}
        )
    )
    return Answer(text=text, table=table)


def _memory_unit(df: pd.DataFrame) -> str:
    return "GB" if "peak_GB" in df else "MB"


@builds_each_handout("optimizer_state_sharding_accounting.a")
def _sharding_memory(results: Results, handout: str) -> Answer:
    raw = results.table("sharding_memory_breakdown")
    unit = _memory_unit(raw)

    def measured(rows: pd.DataFrame) -> bool:  # an optimizer that ran out of memory has no rows
        return {"unsharded", "sharded"} <= set(rows[rows.point == "after step"].optimizer)

    pick = _for_handout(raw, handout, measured)
    df = pick.rows.rename(columns=lambda c: c.removesuffix(f"_{unit}"))
    setup = _sharding_setup(results, pick.size)
    t = df.groupby(["optimizer", "point"], sort=False).max(numeric_only=True)
    if not {("unsharded", "after step"), ("sharded", "after step")} <= set(t.index):
        raise NotAnswered("the unsharded and sharded optimizers were not both measured")
    at = lambda kind, point, col: t.loc[(kind, point), col]  # noqa: E731
    f = lambda x: _gb(x, unit)  # noqa: E731
    peaks = df["peak"].notna().all()
    u, s = "unsharded", "sharded"
    if peaks:
        text = (
            f"With {setup.describe()}, the worst rank's peak memory, unsharded → sharded, is "
            f"{f(at(u, 'after init', 'peak'))} "
            f"→ {f(at(s, 'after init', 'peak'))} after model initialization, {f(at(u, 'before step', 'peak'))} → "
            f"{f(at(s, 'before step', 'peak'))} directly before the optimizer step (the peak of forward and backward), "
            f"and {f(at(u, 'after step', 'peak'))} → {f(at(s, 'after step', 'peak'))} directly after it. "
        )
    else:
        text = (
            f"With {setup.describe()}, there is no allocator peak to read on a CPU, so this counts the live tensors "
            f"on the worst rank: {f(at(u, 'after init', 'parameters'))} of parameters after initialization with "
            f"either optimizer. "
        )
    text += (
        f"After the step a rank holds {f(at(u, 'after step', 'parameters'))} of fp32 parameters and "
        f"{f(at(u, 'after step', 'gradients'))} of gradients either way, and "
        f"{f(at(u, 'after step', 'optimizer_state'))} "
        f"→ {f(at(s, 'after step', 'optimizer_state'))} of AdamW state (the analysis expects "
        f"{f(at(u, 'after step', 'expected_optimizer_state'))} → {f(at(s, 'after step', 'expected_optimizer_state'))})"
        + (
            f", plus {f(at(u, 'after step', 'rest'))} → {f(at(s, 'after step', 'rest'))} of other tensors"
            if peaks
            else ""
        )
        + ". This matches the expectation: AdamW's state is created at the first step and lives across steps, so "
        + (
            f"halving it lowers every later peak, before the step included, by "
            f"{f(at(u, 'before step', 'peak') - at(s, 'before step', 'peak'))} (before) and "
            f"{f(at(u, 'after step', 'peak') - at(s, 'after step', 'peak'))} (after), while the peak after "
            "initialization, which precedes the state, does not move."
            if peaks
            else "halving it lowers what a rank holds before and after every later step by "
            f"{f(at(u, 'after step', 'optimizer_state') - at(s, 'after step', 'optimizer_state'))}."
        )
    )
    if "zero" in t.index.get_level_values(0) and peaks:
        text += (
            f" PyTorch's ZeroRedundancyOptimizer peaks at {f(at('zero', 'before step', 'peak'))} and "
            f"{f(at('zero', 'after step', 'peak'))} in the same run."
        )
    cols = (
        ["peak", "parameters", "gradients", "optimizer_state", "rest"]
        if peaks
        else ["parameters", "gradients", "optimizer_state"]
    )
    names = {"unsharded": "AdamW", "sharded": "ShardedOptimizer", "zero": "ZeroRedundancyOptimizer"}
    table = t[cols].reset_index()
    table["optimizer"] = table.optimizer.map(names)
    table = table.rename(
        columns={
            "peak": f"peak since previous point ({unit})",
            "parameters": f"parameters ({unit})",
            "gradients": f"gradients ({unit})",
            "optimizer_state": f"optimizer state ({unit})",
            "rest": f"other tensors ({unit})",
        }
    ).round(2 if unit == "GB" else 3)
    return Answer(text=text, table=table, caveat=_run_caveat(setup, handout, pick.xl_failed))


@builds_each_handout("optimizer_state_sharding_accounting.b")
def _sharding_time(results: Results, handout: str) -> Answer:
    pick = _for_handout(results.table("sharding_step_time"), handout, _ok_with(("unsharded", "sharded"), "optimizer"))
    df = pick.rows
    ok = df[df.status == "ok"].set_index("optimizer")
    if not {"unsharded", "sharded"} <= set(ok.index):
        raise NotAnswered("the unsharded and sharded optimizers were not both timed")
    setup = _sharding_setup(results, pick.size)
    u, s = ok.loc["unsharded"], ok.loc["sharded"]
    text = (
        f"With {setup.describe()}, an iteration takes {_ms(u.step_ms)} ± {u.step_std_ms:.1f} ms with AdamW and "
        f"{_ms(s.step_ms)} ± {s.step_std_ms:.1f} ms with the sharded AdamW, {_x(s.step_ms / u.step_ms)} "
        f"({s.step_ms - u.step_ms:+.1f} ms). The optimizer phase goes from {_ms(u.optimizer_ms)} to "
        f"{_ms(s.optimizer_ms)}, since each rank updates only its own parameters and then sends them to the "
        f"others, while forward+backward takes "
        + (
            f"{_ms(u.fwd_bwd_ms)} with both."
            if round(u.fwd_bwd_ms, 1) == round(s.fwd_bwd_ms, 1)
            else f"{_ms(u.fwd_bwd_ms)} and {_ms(s.fwd_bwd_ms)} respectively."
        )
    )
    pairs = [("sharded against unsharded", s, u)]
    if "zero" in ok.index:
        z = ok.loc["zero"]
        text += (
            f" PyTorch's ZeroRedundancyOptimizer takes {_ms(z.step_ms)} ± {z.step_std_ms:.1f} ms in the same run "
            f"(optimizer phase {_ms(z.optimizer_ms)}): ours is {_x(s.step_ms / z.step_ms)} its time."
        )
        pairs.append(("ours against ZeroRedundancyOptimizer", s, z))
    text += _spread_note(pairs)
    names = {"unsharded": "AdamW", "sharded": "ShardedOptimizer", "zero": "ZeroRedundancyOptimizer"}
    cols = {
        "step_ms": "iteration (ms)",
        "step_std_ms": "± std (ms)",
        "fwd_bwd_ms": "forward+backward (ms)",
        "sync_ms": "exposed gradient all-reduce (ms)",
        "optimizer_ms": "optimizer step incl. parameter exchange (ms)",
    }
    table = (
        ok[[c for c in cols if c in ok]]
        .rename(index=names, columns=cols)
        .rename_axis("optimizer")
        .reset_index()
        .round(1)
    )
    return Answer(text=text, table=table, caveat=_run_caveat(setup, handout, pick.xl_failed))


def _of_size(df: pd.DataFrame, size: str | None) -> pd.DataFrame:
    return df[df["size"].astype(str) == size] if size is not None and "size" in df else df


@builds("optimizer_state_sharding_accounting.c")
def sharding_vs_zero1(results: Results) -> Answer:
    """How ours differs from ZeRO stage 1, in memory and communication, computed for both handouts' XL models."""
    mem_all, comm_all = results.table("sharding_analysis_memory"), results.table("sharding_analysis_communication")
    sizes = list(dict.fromkeys(mem_all["size"].astype(str))) if "size" in mem_all else [None]
    # the 2025 XL first (the model of the 2025 sub-part); a table without sizes is the 2025 XL's
    sizes.sort(key=lambda s: s is not None and not _is_xl(s, "2025"))
    ours, zero1, ddp = "optimizer state sharding (ours)", "ZeRO stage 1 (P_os)", "DDP (all replicated)"

    def of(size):
        mem, comm = _of_size(mem_all, size).set_index("label"), _of_size(comm_all, size).set_index("label")
        return mem, comm, mem.loc[ddp, "parameters_GB"] * 1e9 / 4

    mem, comm, params = of(sizes[0])
    world = round(mem.loc[ddp, "optimizer_state_GB"] / mem.loc[zero1, "optimizer_state_GB"])
    extra_kb = (mem.loc[ours, "optimizer_state_GB"] - mem.loc[zero1, "optimizer_state_GB"]) * 1e6
    name = _model_name(sizes[0]) if sizes[0] is not None else "the 2025 handout's XL model"
    text = (
        f"ZeRO stage 1 replaces the gradient all-reduce with a reduce-scatter (each rank receives only its slice "
        f"of the summed gradients) followed by an all-gather of the updated parameters, whereas ours keeps DDP's "
        f"all-reduce and then sends each parameter from its owner to the other ranks; for {name} ({params / 1e9:.3f} B "
        f"parameters) on {world} ranks that is {comm.loc[ddp, 'sent_per_rank_GB']:.2f} GB sent per rank and step for "
        f"DDP and ZeRO-1 ({_x(comm.loc[zero1, 'relative_to_ddp'])} DDP) against "
        f"{comm.loc[ours, 'sent_per_rank_GB']:.2f} GB for ours ({_x(comm.loc[ours, 'relative_to_ddp'])}). "
        f"In memory both keep the full fp32 weights and gradients ({mem.loc[ours, 'parameters_GB']:.2f} GB each) and "
        f"1/{world} of AdamW's state, but ZeRO-1 splits a flat buffer into equal slices "
        f"({mem.loc[zero1, 'optimizer_state_GB']:.3f} GB of state per rank) while ours assigns whole parameters, "
        f"leaving {extra_kb:,.1f} kB more on the most loaded rank (greedy assignment bounds the excess by one "
        f"parameter's state)."
    )
    for size in sizes[1:]:
        m2, c2, p2 = of(size)
        text += (
            f" For {_model_name(size)} ({p2 / 1e9:.3f} B parameters) the same comparison gives "
            f"{c2.loc[ddp, 'sent_per_rank_GB']:.2f} GB against {c2.loc[ours, 'sent_per_rank_GB']:.2f} GB sent per rank "
            f"and step, {m2.loc[ours, 'parameters_GB']:.2f} GB each of weights and gradients, and "
            f"{(m2.loc[ours, 'optimizer_state_GB'] - m2.loc[zero1, 'optimizer_state_GB']) * 1e6:,.1f} kB more "
            "optimizer state than ZeRO-1's equal slices on the most loaded rank."
        )
    if results.has("sharding_zero_paper_mixed_precision"):
        zp = _of_size(results.table("sharding_zero_paper_mixed_precision"), sizes[0]).set_index("strategy")
        text += (
            f" ZeRO's paper counts mixed-precision training, where the fp32 master weights are optimizer state and "
            f"are sharded too: there P_os needs {zp.loc['zero1', 'total_GB']:.2f} GB per rank for "
            f"{'this model' if len(sizes) == 1 else name} against DDP's "
            f"{zp.loc['ddp', 'total_GB']:.2f} GB, while ours, training in fp32, keeps full fp32 weights."
        )
    rows = [ddp, ours, zero1]
    frames = []
    for size in sizes:
        m2, c2, _ = of(size)
        frame = pd.DataFrame(
            {
                "scheme": rows,
                "collectives per step": [c2.loc[r, "collectives"] for r in rows],
                "sent per rank (GB)": [c2.loc[r, "sent_per_rank_GB"] for r in rows],
                "optimizer state per rank (GB)": [m2.loc[r, "optimizer_state_GB"] for r in rows],
                "weights+gradients+state per rank (GB)": [m2.loc[r, "total_GB"] for r in rows],
            }
        )
        if len(sizes) > 1:
            frame.insert(0, "model", _short_name(size))
        frames.append(frame)
    return Answer(text=text, table=pd.concat(frames, ignore_index=True).round(3))


# ---------------------------------------------------------------- 17: FSDP


def _fsdp_setup(results: Results, size: str | None = None) -> Setup:
    ranks = int(results.table("fsdp_equality")["rank"].nunique()) if results.has("fsdp_equality") else None
    return _setup(results, NB_FSDP, "fsdp_setup", world_size=ranks, size=size)


def _fsdp_compared(rows: pd.DataFrame) -> bool:
    """Whether this FSDP and FSDP2 both ran at some compute dtype."""
    ok = rows[rows.status == "ok"]
    return any({"fsdp", "fsdp2"} <= set(g.strategy) for _, g in ok.groupby("compute_dtype"))


@builds("fsdp")
def fsdp(results: Results) -> Answer:
    """Where FSDP is, its equality with non-parallel training, and how it compares with FSDP2."""
    eq = results.table("fsdp_equality")
    pick = _for_handout(results.table("fsdp_runs"), "2026", _fsdp_compared)
    runs = pick.rows
    setup = _fsdp_setup(results, pick.size)
    worst = eq.groupby("compute_dtype", sort=False).agg(
        max_abs_diff=("max_abs_diff", "max"), tolerance=("tolerance", "first")
    )
    checks = ", ".join(f"{r.max_abs_diff:.1e} in {d} (tolerance {r.tolerance:.0e})" for d, r in worst.iterrows())
    text = (
        "Class `FSDP(module, compute_dtype=None)` of `cs336_systems.distributed` (file `distributed/fsdp.py`) "
        "shards every Linear and Embedding weight into one fp32 slice per rank (norm gains stay replicated, their "
        "gradients all-reduced); module hooks all-gather a weight in the compute dtype before its module runs, "
        "launching the next module's gather when a module starts so that a gather begins only after the module two "
        "before has finished, free it after use, gather again for the backward pass and reduce-scatter the "
        "gradients to their owners, and each rank's shard trains with the assignment-1 AdamW. "
        f"After {int(eq.steps.iloc[0])} steps on the {eq['size'].iloc[0]} model on {eq['rank'].nunique()} ranks the "
        f"gathered weights differ from non-parallel training by at most {checks}."
    )
    ok = runs[runs.status == "ok"].set_index(["strategy", "compute_dtype"])
    ratios, pairs = [], []
    for dtype in runs.compute_dtype.unique():
        if ("fsdp", dtype) in ok.index and ("fsdp2", dtype) in ok.index:
            a, b = ok.loc[("fsdp", dtype)], ok.loc[("fsdp2", dtype)]
            peak = f", peak memory {_x(a.peak / b.peak)} FSDP2's" if pd.notna(a.peak) and pd.notna(b.peak) else ""
            ratios.append(f"in {dtype} {_ms(a.step_ms)} against {_ms(b.step_ms)}, {_x(a.step_ms / b.step_ms)}{peak}")
            pairs.append((f"the {dtype} steps", a, b))
    if ratios:
        text += (
            f" With {_model_name(setup.size)} on {setup.ranks}, a training step of this FSDP and of PyTorch's FSDP2 "
            f"(`fully_shard` on every block) in the same run takes {'; '.join(ratios)}." + _spread_note(pairs)
        )
    cols = {
        "step_ms": "step (ms)",
        "step_std_ms": "± std (ms)",
        "fwd_bwd_ms": "forward+backward (ms)",
        "optimizer_ms": "optimizer step (ms)",
        "peak": "peak memory (GB)",
    }
    names = {"replicated": "replicated (DDP)", "fsdp": "this FSDP", "fsdp2": "PyTorch FSDP2"}
    table = runs[runs.status == "ok"].copy()
    table["strategy"] = table.strategy.map(names)
    if table["peak"].notna().any():
        table["peak"] = table["peak"] / 1e9
    else:
        cols.pop("peak")
    table = (
        table[["strategy", "compute_dtype", *cols]].rename(columns={**cols, "compute_dtype": "compute dtype"}).round(2)
    )
    return Answer(text=text, table=table.reset_index(drop=True), caveat=_run_caveat(setup, "2026", pick.xl_failed))


def _measured_saving(results: Results, setup: Setup) -> str:
    """The measured run's expected saving next to what it saved (live state, and the allocator's peak on a GPU),
    at the setting's model where the run measured several."""
    if not (results.has("fsdp_runs") and results.has("fsdp_expected_saving_measured_model")):
        return ""
    expected = _of_size(results.table("fsdp_expected_saving_measured_model"), setup.size)
    if "fsdp" not in set(expected.strategy):
        return ""
    expected = expected.set_index("strategy").loc["fsdp", "saving_GB"]
    runs = _of_size(results.table("fsdp_runs"), setup.size)
    ok = runs[(runs.status == "ok") & (runs.compute_dtype == "fp32")].set_index("strategy")
    if not {"replicated", "fsdp"} <= set(ok.index):
        return ""
    r, f = ok.loc["replicated"], ok.loc["fsdp"]
    unit, scale = ("GB", 1e9) if expected > 1 else ("MB", 1e6)
    state = (r.parameters + r.gradients + r.optimizer_state - f.parameters - f.gradients - f.optimizer_state) / scale
    digits = 2 if unit == "GB" else 3
    text = (
        f" Measured with {_model_name(setup.size)} on {setup.ranks} in fp32, where the analysis expects "
        f"{expected * 1e9 / scale:.{digits}f} {unit}: the live weights, gradients and optimizer state shrink by "
        f"{state:.{digits}f} {unit}"
    )
    if pd.notna(r.peak) and pd.notna(f.peak):
        drop = (r.peak - f.peak) / scale
        text += (
            f", and the allocator's peak falls from {r.peak / scale:.2f} to {f.peak / scale:.2f} {unit}, "
            f"{drop:.2f} {unit} ({pct(drop / (expected * 1e9 / scale))} of the expected saving), the peak also "
            "holding what the analysis ignores, the gathered weights and gradient buffers of the modules in flight"
        )
    return text + "."


@builds("fsdp_accounting.a")
def fsdp_expected_saving(results: Results) -> Answer:
    """The memory FSDP should save from the peak, from the sharding analysis, next to what the run saved."""
    measured = (
        _for_handout(results.table("fsdp_runs"), "2026", lambda rows: (rows.status == "ok").any())
        if results.has("fsdp_runs")
        else _Rows(pd.DataFrame(), None)
    )
    setup = _fsdp_setup(results, measured.size)
    # The analysis of both XL models (a size column); runs before it kept the 2026 xl's in a table of its own.
    analysis = results.table("fsdp_analysis_memory")
    if "size" in analysis:
        pick = _for_handout(analysis, "2026")
        analysis, model = pick.rows, pick.size
    elif results.has("fsdp_analysis_memory_2026_xl"):
        analysis, model = results.table("fsdp_analysis_memory_2026_xl"), XL_2026
    else:
        model = "xl"
    analysis = analysis.set_index("strategy")
    ddp, sharded = analysis.loc["ddp"], analysis.loc["fsdp"]
    params = ddp.parameters_GB * 1e9 / 4
    world = round(ddp.parameters_GB / (sharded.parameters_GB - 0)) if sharded.parameters_GB else setup.world_size
    text = (
        f"Without sharding a rank holds 16 bytes per parameter (fp32 weights and gradients, AdamW's two fp32 "
        f"moments); FSDP keeps 1/N of that for the sharded Linear and Embedding weights (Ψ_s) and all of it for the "
        f"replicated norm gains, so it saves 16·Ψ_s·(1 − 1/N) bytes from the peak, the gathered-weight buffers "
        f"ignored. For {_model_phrase(model, params)} on N = {world} ranks that is {ddp.total_GB:.2f} GB → "
        f"{sharded.total_GB:.2f} GB per rank, an expected saving of {sharded.saving_vs_ddp_GB:.2f} GB."
    )
    text += _measured_saving(results, setup)
    table = (
        analysis.reset_index()[["label", "parameters_GB", "gradients_GB", "optimizer_state_GB", "total_GB"]]
        .rename(
            columns={
                "label": "strategy",
                "parameters_GB": "weights (GB)",
                "gradients_GB": "gradients (GB)",
                "optimizer_state_GB": "AdamW state (GB)",
                "total_GB": "total per rank (GB)",
            }
        )
        .round(2)
    )
    caveats = []
    if not _is_xl(model, "2026"):
        caveats.append(
            f"The 2026 handout's standard model is its xl ({_model_shape(XL_2026)}); this run's analysis is "
            f"for {_model_phrase(model, params)}."
        )
    if not setup.on_gpus:
        caveats.append(f"The measured comparison ran on {setup.ranks}, without an allocator peak to read.")
    return Answer(text=text, table=table, caveat=" ".join(caveats))


@builds("fsdp_accounting.b")
def fsdp_gather_timing(results: Results) -> Answer:
    """Whether the forward all-gathers keep pace with compute, from profiled forward passes (figure)."""
    if not results.has("fsdp_forward_profiles"):
        return _gather_timing_of_one_step(results)
    pick = _for_handout(results.table("fsdp_forward_profiles"), "2026", lambda rows: rows["shown"].astype(bool).any())
    profiles = pick.rows
    if not profiles["shown"].astype(bool).any():
        raise NotAnswered("no forward pass could be profiled in this run")
    p = profiles[profiles["shown"].astype(bool)].iloc[0]
    setup = _fsdp_setup(results, pick.size)
    t = results.table("fsdp_forward_gathers")
    late = t[~t.in_time & t.gather_found]
    shape = f"{_sequences(p.batch_per_rank)} of {int(p.context_length)} tokens per rank"
    gpu = pd.notna(p.busy_fraction)
    text = (
        f"Forward passes of {_model_name(pick.size or setup.size)} with FSDP in {p.compute_dtype} were profiled on "
        f"rank 0 of {setup.ranks}, without gradients (torch.no_grad: FSDP's hooks gather and prefetch as in training"
        + (", and a batch large enough to keep the GPU busy fits). " if gpu else "). ")
    )
    figure = results.figure("fsdp_profiler_timeline")
    caveat = "The timeline is drawn from a torch.profiler trace, not an Nsight Systems screenshot."
    if not gpu:
        text += (
            f"At {shape}, {int(p.gathers_in_time)} of the {int(p.gathers)} forward all-gathers finished before "
            f"their module's forward needed the weight; a gather counts as late when its wait blocked"
            + (f", and {len(late)} did, by {_ms(late.exposed_ms.sum())} in all." if len(late) else ".")
        )
        caveat = f"On the CPU (gloo) the gathers are timed by the host's waits, not by GPU kernels. {caveat}"
        return Answer(text=text, figure=figure, caveat=f"{caveat} {_run_caveat(setup, '2026', pick.xl_failed)}".strip())
    threshold = float(p.busy_threshold)
    text += (
        f"At {shape} the GPU was busy {pct(p.busy_fraction, 0)} of the {_ms(p.forward_ms)} forward (the union of its "
        f"compute kernels over the pass's span on the GPU clock)"
        + (
            ", so the GPU, not the host, set the pace. "
            if p.gpu_bound
            else f", below the {pct(threshold, 0)} from which this report counts a pass as paced by the GPU. "
        )
        + f"Its {int(p.gathers)} all-gathers kept the NCCL stream busy {_ms(p.gather_ms)}, {pct(p.hidden_fraction)} of "
        f"it while a compute kernel ran on the other stream, which leaves {_ms(p.exposed_ms)} of communication "
        f"exposed ({pct(p.exposed_ms / p.forward_ms)} of the forward); {int(p.gathers_in_time)} of the "
        f"{int(p.gathers)} gathers finished before their module's first kernel"
        + (
            f" and {len(late)} {'was' if len(late) == 1 else 'were'} late by {_ms(late.exposed_ms.sum())} in all"
            if len(late)
            else ""
        )
        + ". "
    )
    if p.gpu_bound:
        # exposed: the GPU only communicated; under 5% of the pass, the gathers cost the forward little
        if p.exposed_ms < 0.05 * p.forward_ms:
            text += (
                "So the all-gathers overlap compute and finish in time: communication does not hold up the forward "
                "pass."
                if p.hidden_fraction >= 0.5
                else "So the all-gathers finish in time, though mostly while the compute stream was between kernels "
                "rather than beside compute."
            )
        else:
            text += (
                f"So communication does not keep pace with compute: for {pct(p.exposed_ms / p.forward_ms)} of the "
                "forward pass the GPU does nothing but gather weights."
            )
    else:
        text += (
            f"With the GPU idle {pct(1 - p.busy_fraction, 0)} of the pass, the gathers could run in its idle time: "
            "this profile shows that they are issued early enough, not whether they keep pace with compute."
        )
        caveat += (
            f" Even the busiest forward profiled kept the GPU busy only {pct(p.busy_fraction, 0)} of the time, so "
            "it cannot show whether the gathers would keep pace with a compute-bound forward pass."
        )
    smaller = profiles[
        (profiles.status == "ok") & (profiles.batch_per_rank < p.batch_per_rank) & profiles.busy_fraction.notna()
    ]
    if len(smaller):
        s0 = smaller.iloc[0]
        text += (
            f" At {_sequences(s0.batch_per_rank)} per rank the same forward kept the GPU busy only "
            f"{pct(s0.busy_fraction, 0)} of {_ms(s0.forward_ms)}"
            + (
                ": there the GPU spent most of the pass waiting for the host's hooks and kernel launches."
                if s0.busy_fraction < 0.5
                else "."
            )
        )
    return Answer(text=text, figure=figure, caveat=f"{caveat} {_run_caveat(setup, '2026', pick.xl_failed)}".strip())


def _sequences(n: float) -> str:
    return f"{int(n)} sequence{'s' * (int(n) != 1)}"


def _gather_timing_of_one_step(results: Results) -> Answer:
    """Runs that profiled one training step at the training batch (no forward profiles table)."""
    t = results.table("fsdp_forward_gathers")
    setup = _fsdp_setup(results)
    timed = t[t.gather_found]
    in_time = int(t.in_time.sum())
    late = t[~t.in_time & t.gather_found]
    forward = t.compute_end_ms.max() - t.compute_start_ms.min()
    gpu_clock = setup.on_gpus and str(t.clock.iloc[0]).startswith("GPU")
    model = _model_name(setup.size)
    count = f"all {len(t)}" if in_time == len(t) else f"{in_time} of the {len(t)}"
    text = (
        f"In one profiled step of {model} with bf16 compute on rank 0 of {setup.ranks}, {count} "
        f"forward all-gathers finished before their module's "
        + ("first kernel started" if gpu_clock else "forward needed the weight")
    )
    ready = timed[timed.in_time]
    lead = (ready.compute_start_ms - ready.gather_end_ms).median()
    text += f", {'those ' if len(ready) < len(t) else ''}a median {_ms(lead)} before it" if len(ready) else ""
    text += (
        f"; {len(late)} were late, by {_ms(late.exposed_ms.sum())} in all."
        if len(late)
        else ", so none delayed the forward pass."
    )
    if gpu_clock:
        idle = (timed.compute_start_ms - timed.ready_ms).median()
        gap = (t.compute_start_ms.shift(-1) - t.compute_start_ms).dropna().median()
        nccl = (timed.gather_end_ms - timed.gather_start_ms).sum()
        text += (
            f" But this forward pass was paced by the host, not the GPU: it lasted {_ms(forward)}, consecutive "
            f"modules' first kernels started a median {_ms(gap)} apart, and before each module the compute stream "
            f"sat idle a median {_ms(idle)} with its gather long finished, so the {_ms(nccl)} of all-gather kernels "
            "ran in idle time."
        )
        caveat = (
            "Because the GPU was mostly idle in this profile, it shows that the gathers are issued early enough, "
            "not that they would keep pace with a compute-bound forward pass or how much they overlap compute. "
        )
    else:
        text += (
            f" The profiled forward pass lasted {_ms(forward)} on the CPU; a gather counts as late when its wait "
            "blocked."
        )
        caveat = "On the CPU (gloo) the gathers are timed by the host's waits, not by GPU kernels. "
    caveat += "The timeline is drawn from a torch.profiler trace, not an Nsight Systems screenshot."
    extra = _run_caveat(setup, "2026")
    return Answer(text=text, figure=results.figure("fsdp_profiler_timeline"), caveat=f"{caveat} {extra}".strip())
