"""Answer of the 2026 leaderboard (notebook 20): the full 8B training step at batch 2 on two GPUs."""

from __future__ import annotations

import pandas as pd

from cs336_systems.benchmarking.gpu_telemetry import RUN_SUMMARIES, across_gpus
from cs336_systems.experiments.answers import NotAnswered, Results, builds
from cs336_systems.report.answers import Answer
from cs336_systems.training.memory_plan import CUDA_MARGIN_BYTES

HANDOUT_REP_MS, HANDOUT_WARMUP_MS = 30_000, 10_000
NATIVE = "The torch-native step (SDPA, full logits and `F.cross_entropy`, `torch.optim.AdamW`)"


def timing_words(row: pd.Series) -> str:
    """How a row was timed: its own do_bench settings (the command table's rows, from before the settings were
    recorded, were all timed at the handout's)."""
    rep, warmup = row.get("rep_ms"), row.get("warmup_ms")
    if rep is None or pd.isna(rep):
        rep, warmup = HANDOUT_REP_MS, HANDOUT_WARMUP_MS
    call = f"`triton.testing.do_bench(rep={int(rep)}, warmup={int(warmup)})`"
    if (int(rep), int(warmup)) == (HANDOUT_REP_MS, HANDOUT_WARMUP_MS):
        return call + ", as the handout times it"
    return call + f", shorter than the handout's rep={HANDOUT_REP_MS}, warmup={HANDOUT_WARMUP_MS}"


def _notebook_two_gpu_facts(results: Results) -> dict[str, dict]:
    """What the notebook's two-GPU run recorded of each variant beside its time: the blocks its memory plan
    recomputes (rank 0's plan, one True or False per block) and of how many, whether AdamW's states waited in
    host memory, and the slower GPU's median SM clock and the largest share of samples a GPU spent at its
    power cap (each a list per GPU)."""
    if not results.has("leaderboard_8b_two_gpus"):
        return {}
    rows = results.table("leaderboard_8b_two_gpus")
    facts = {}
    for row in rows.to_dict("records"):
        if row.get("world_size") != 2:
            continue
        fact = {}
        if isinstance(row.get("plan"), str):
            recomputed, kept = row["plan"].count("True"), row["plan"].count("False")
            fact.update(blocks_recomputed=recomputed, layers=recomputed + kept)
        if pd.notna(row.get("states_offloaded")):
            fact["states_offloaded"] = str(row["states_offloaded"]) == "True"
        for column, name, how in RUN_SUMMARIES:
            if (value := across_gpus(row.get(column), how)) is not None:
                fact[name] = value
        facts[row["variant"]] = fact
    return facts


def _after(command: pd.DataFrame, when: pd.Timestamp | None) -> pd.DataFrame:
    """The command runs dated after `when` (none where either has no date)."""
    if when is None or "date" not in command:
        return command.iloc[:0]
    dates = pd.to_datetime(command.date.astype("string").str.removesuffix(" UTC"), errors="coerce")
    return command[dates > when]


def _two_gpu_rows(results: Results) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, str]:
    """The two-GPU rows at the card's whole memory (the notebook's own run, unless command runs of our step
    were made after it; else the command runs beside it), the command runs at the whole card and those under
    a per-process memory cap (an 80 GB card simulated on a larger one); and a caveat where the first rows are
    not the notebook's. The command table gains a row per run: later rows are later runs."""
    command = pd.DataFrame()
    if results.has("leaderboard_8b_two_gpus_command"):
        rows = results.table("leaderboard_8b_two_gpus_command")
        command = rows[(rows.world_size == 2) & (rows.status == "ok")]
    in_cap = command.memory_cap_gib.notna() if "memory_cap_gib" in command else pd.Series(False, index=command.index)
    capped = command[in_cap]
    if results.has("leaderboard_8b"):
        rows = results.table("leaderboard_8b")
        two = rows[(rows.world_size == 2) & rows.step_ms.notna()]
        if "ours" in set(two.variant):
            facts = _notebook_two_gpu_facts(results)
            two = two.rename(columns={"step_ms": "ms"})
            for name in ("blocks_recomputed", "layers", "states_offloaded", "sm_mhz", "power_capped"):
                two[name] = [facts.get(v, {}).get(name) for v in two.variant]
            later = _after(command[~in_cap], results.run_date("20_leaderboard_8b"))
            if "ours" not in set(later.get("variant", ())):
                return two, command[~in_cap], capped, ""
            notebook = two[two.variant == "ours"].iloc[-1]
            return (
                later,
                command[~in_cap],
                capped,
                (
                    "Timed by `torchrun --nproc-per-node 2 -m cs336_systems.training.leaderboard_8b` in a run after "
                    f"this notebook's (`tools/leaderboard_8b_two_gpus.py`, each command from empty compile caches; "
                    f"its table names the code each ran); the notebook's own two-GPU run took {notebook.ms:,.1f} ms."
                ),
            )
    if "variant" in command and "ours" in set(command[~in_cap].variant):
        return (
            command[~in_cap],
            command[~in_cap],
            capped,
            (
                "Timed by `torchrun --nproc-per-node 2 -m cs336_systems.training.leaderboard_8b` beside this "
                "notebook's run, which had one GPU (`tools/leaderboard_8b_two_gpus.py`; its table names each "
                "command and whether its compile caches were empty)."
            ),
        )
    raise NotAnswered("the step at batch 2 needs two GPUs, and this run had fewer")


def _same_run(rows: pd.DataFrame, ours: pd.Series) -> pd.Series | None:
    """The torch-native row timed in the same run as `ours` (the same commit where rows name one), if any."""
    native = rows[rows.variant == "torch_native"]
    if "commit" in rows and pd.notna(ours.get("commit")):
        native = native[native.commit == ours.commit]
    return native.iloc[-1] if len(native) else None


def _recomputed(row: pd.Series) -> int | None:
    value = row.get("blocks_recomputed")
    return None if value is None or pd.isna(value) else int(value)


def _previous_run_of_the_same_command(runs: pd.DataFrame, row: pd.Series) -> pd.Series | None:
    """The latest row of `runs` before `row` (another commit) whose command is `row`'s, its do_bench settings
    and flags alike (the text before the run's own parenthesis), if any."""
    if "command" not in runs or not isinstance(row.get("command"), str):
        return None
    command = row.command.split(" (")[0]
    same = runs[
        (runs.command.astype(str).str.split(" (", regex=False).str[0] == command)
        & (runs.commit != row.commit)
        & (runs.index < row.name)
    ]
    return same.iloc[-1] if len(same) else None


def _latest_command_run(runs: pd.DataFrame, row: pd.Series) -> pd.Series | None:
    """Where `row` is the notebook's own run (no command): the latest command run of ours in `runs` with its
    states where `row` had them; else None."""
    if isinstance(row.get("command"), str) or "command" not in runs or row.variant != "ours":
        return None
    same = [r for _, r in runs[runs.variant == "ours"].iterrows() if _offloaded(r) == _offloaded(row)]
    return same[-1] if same else None


def _offloaded(row: pd.Series) -> bool:
    """Whether a row's step ran with AdamW's states in host memory (a command row's command names the flag, the
    notebook's row says so)."""
    if isinstance(row.get("command"), str):
        return "--offload-states" in row.command
    return str(row.get("states_offloaded")) == "True"


def one_gpu_sentences(results: Results) -> tuple[str, list[pd.Series], list[str]]:
    """The command on one GPU (`tools/leaderboard_8b_two_gpus.py --one-gpu`), the latest run on each kind of
    GPU: where the whole model fits, ours against the torch-native step of the same run; where the plan refuses
    it (an 80 GB card), the refusal's need and budget, ours on the layers it names, and the torch-native step on
    those layers. The sentences, the rows shown and their labels."""
    if not results.has("leaderboard_8b_one_gpu_command"):
        return "", [], []
    rows = results.table("leaderboard_8b_one_gpu_command")
    text, shown, labels, timed_steps = "", [], [], {}
    for device, runs in rows.groupby("device", sort=False):
        runs = runs[runs.commit == runs.commit.iloc[-1]]  # one run: the latest
        ours = runs[(runs.variant == "ours") & (runs.status == "ok")]
        if not len(ours):
            continue
        ours = ours.iloc[-1]
        native = runs[(runs.variant == "torch_native") & (runs.layers == ours.layers)]
        native = native.iloc[-1] if len(native) else None
        refused = runs[(runs.variant == "ours") & (runs.status == "does not fit")]
        steps = (
            f"{_recomputed(ours)} of {int(ours.layers)} blocks recomputed, " if _recomputed(ours) is not None else ""
        )
        timed = f"ours takes {ours.ms:,.1f} ms ({steps}peak {ours.peak_gib:.1f} GiB)"
        if len(refused):
            ref = refused.iloc[-1]
            text += (
                f" On one {device} the whole model does not fit: the memory plan needs at least {ref.need_gib:.1f} GiB "
                f"against its budget of {ref.budget_gib:.1f} GiB (what the process can still get less a "
                f"{CUDA_MARGIN_BYTES / 2**30:g} GiB margin), and the command stops with that and "
                f"what would fit; on {int(ours.layers)} of its {int(ref.layers)} layers, the most it names, {timed}"
            )
            shown.append(ref)
            labels.append(f"one {device}, whole model")
        else:
            text += f" On one {device} at batch 1, {timed}"
        shown.append(ours)
        labels.append(f"one {device}")
        timed_steps[bool(len(refused))] = ours
        if native is not None and native.status == "ok":
            text += (
                f", against the torch-native step's {native.ms:,.1f} ms in the same run: {ours.ms / native.ms:.3f}×."
            )
            shown.append(native)
            labels.append(f"one {device}")
        elif native is not None and "out of memory" in str(native.note).lower():
            text += f"; the torch-native step on the same {int(native.layers)} layers runs out of memory."
            shown.append(native)
            labels.append(f"one {device}")
        else:
            text += "."
    if len(timed_steps) == 2:  # a card that needed fewer layers beside one that held them all
        small, whole = timed_steps[True], timed_steps[False]
        if small.ms / small.layers > whole.ms / whole.layers and (_recomputed(small) or 0) > (_recomputed(whole) or 0):
            clocks = ""
            if pd.notna(small.get("sm_mhz")) and pd.notna(whole.get("sm_mhz")):
                clocks = f", and its SM clock held at {small.sm_mhz:,.0f} MHz against {whole.sm_mhz:,.0f} MHz"
            text += (
                f" Per layer the {small.device} is the slower ({small.ms / small.layers:,.0f} against "
                f"{whole.ms / whole.layers:,.0f} ms): with less memory its plan recomputes {_recomputed(small)} "
                f"blocks, a second forward each{clocks}."
            )
    return text, shown, labels


@builds("leaderboard.2026")
def eight_b_step(results: Results) -> Answer:
    two, uncapped, capped, caveat = _two_gpu_rows(results)
    ours = two[two.variant == "ours"].iloc[-1]  # the latest run of our step
    device = ours.get("device", "GPU")
    text = (
        f"Our fastest complete 8B training step (forward, loss, backward, AdamW; context 32,768, one sequence "
        f"per GPU) takes **{ours.ms:,.1f} ms** on two {device}s, timed with {timing_words(ours)}"
        + (
            f"; its memory plan recomputes {_recomputed(ours)} of {int(ours.layers)} blocks"
            if _recomputed(ours) is not None and pd.notna(ours.get("layers"))
            else ""
        )
        + (
            ", AdamW's states waiting in host memory through the forward (the command's default) so that their "
            "GPU memory holds saved activations instead"
            if _offloaded(ours)
            else ""
        )
        + "."
    )
    # the latest run of ours that timed the torch-native step beside it (the same commit)
    compared = next(
        ((row, native) for _, row in two[two.variant == "ours"].iloc[::-1].iterrows()
         if (native := _same_run(two, row)) is not None),
        None,
    )  # fmt: skip
    shown = [ours]
    base = compared[1] if compared is not None and compared[0].name == ours.name else None
    if base is not None:
        text += (
            f" {NATIVE} under the same sharding takes {base.ms:,.1f} ms in the same run: ours is "
            f"{ours.ms / base.ms:.3f}× its time."
        )
        shown.append(base)
    elif compared is not None:
        row, native = compared
        text += (
            f" No torch-native step ran beside it; in an earlier run of both on the same kind of machine ours "
            f"took {row.ms:,.1f} ms and {NATIVE[0].lower() + NATIVE[1:]} under the same sharding {native.ms:,.1f} ms: "
            f"{row.ms / native.ms:.3f}× its time."
        )
        shown += [row, native]
    clock, capped_share = ours.get("sm_mhz"), ours.get("power_capped")
    if pd.notna(clock):
        text += (
            f"\n\nWhile it was timed, the slower GPU's SM clock was {clock:,.0f} MHz (median of `nvidia-smi` samples)"
            + (
                f", with the board's power cap holding it down in {capped_share:.0%} of the samples"
                if pd.notna(capped_share) and capped_share > 0
                else ""
            )
            + ": under a power cap the clock a card settles at, and the step's time with it, varies from card to "
            "card, and the slower of two data-parallel GPUs sets the pace."
        )
        previous = _previous_run_of_the_same_command(uncapped, ours)
        if previous is not None and pd.notna(previous.get("sm_mhz")):
            text += (
                f" The previous run of the same command took {previous.ms:,.1f} ms, its slower GPU at "
                f"{previous.sm_mhz:,.0f} MHz."
            )
        command_run = _latest_command_run(uncapped, ours)
        if command_run is not None and pd.notna(command_run.get("sm_mhz")):
            caches = ", from empty compile caches" if "empty caches" in command_run.command else ""
            text += (
                f" Run on its own by the README's command (`torchrun --nproc-per-node 2 -m "
                f"cs336_systems.training.leaderboard_8b`{caches}), the same step took {command_run.ms:,.1f} ms in "
                f"its latest run, its slower GPU at {command_run.sm_mhz:,.0f} MHz."
            )
    two = f"two {device}s"
    labels = [f"{two}, latest run"] + [f"{two}, latest run" if base is not None else f"{two}, earlier run"] * (
        len(shown) - 1
    )
    if len(capped):
        cap = capped[capped.variant == "ours"].iloc[-1]
        first = cap.get("seconds_to_first_timed_step")
        details = [f"peak {cap.peak_gib:.1f} GiB per GPU"]
        if pd.notna(first):
            details.append(f"{first:.0f} s from process start to the first timed step")
        # the uncapped command run of the same code, the one a ratio can be taken against
        uncapped = uncapped[(uncapped.variant == "ours") & (uncapped.commit == cap.commit)]
        blocks = ""
        if _recomputed(cap) is not None:
            blocks = f"its memory plan recomputes {_recomputed(cap)} of {int(cap.layers)} blocks and "
        ratio = ""
        if len(uncapped):
            whole = uncapped.iloc[-1]
            ratio = f", {cap.ms / whole.ms:.2f}× an uncapped command run of the same code ({whole.ms:,.1f} ms" + (
                f", {_recomputed(whole)} blocks recomputed)" if _recomputed(whole) is not None else ")"
            )
        text += (
            f"\n\nIn a separate command run with each process capped at {cap.memory_cap_gib:g} GiB (`--memory-gib "
            f"{cap.memory_cap_gib:g}`: an 80 GB card's memory simulated on these GPUs) {blocks}the step takes "
            f"{cap.ms:,.1f} ms ({', '.join(details)}){ratio}."
        )
        shown.append(cap)
        labels.append(f"{two}, capped at {cap.memory_cap_gib:g} GiB")
    one_gpu, one_rows, one_labels = one_gpu_sentences(results)
    if one_gpu:
        text += "\n\n" + one_gpu.lstrip()
    shown += one_rows
    labels += one_labels
    table = pd.DataFrame(shown).assign(run=labels)
    if "status" in table:  # a refusal or a failure has no time: the table says which
        table["variant"] = [
            v if pd.isna(st) or st == "ok" else f"{v} ({st})" for v, st in zip(table.variant, table.status)
        ]
    if "blocks_recomputed" not in table:
        table["blocks_recomputed"] = float("nan")
    if "layers" not in table:
        table["layers"] = float("nan")
    table = table[["run", "variant", "layers", "ms", "peak_gib", "blocks_recomputed"]].rename(
        columns={"ms": "step (ms)", "peak_gib": "peak per GPU (GiB)", "blocks_recomputed": "blocks recomputed"}
    )
    return Answer(text, table=table.reset_index(drop=True), caveat=caveat)
