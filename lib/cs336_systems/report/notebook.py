"""What every notebook calls first: profile, output folders, tables, figures and generated prose.

ctx = setup_notebook("01_benchmarking_script", profile=profile)
sizes = ctx.pick(sizes, cpu=["nano", "tiny"], gpu=["small", "medium"])
ctx.save_table(df, "forward_backward")          # CSV next to the report, shown in the notebook
ctx.save_figure(fig, "warmup_steps")            # PNG next to the report, shown once
ctx.md(f"The fastest step is {best:.1f} ms.")   # prose generated from the data
ctx.headline("01", "small fwd+bwd (ms)", 41.2)  # goes into the writeup's summary table
ctx.not_run("NCCL with 4 GPUs", "this machine has 2 GPUs")   # listed in the writeup
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from cs336_systems.report.environment import environment_info, repo_root, resolve_profile


@dataclass
class NotebookContext:
    name: str
    profile: str
    results_dir: Path
    env: dict[str, str] = field(default_factory=dict)

    @property
    def device(self) -> torch.device:
        return torch.device("cuda" if self.profile == "gpu" else "cpu")

    @property
    def figures_dir(self) -> Path:
        return self.results_dir / "figures"

    @property
    def num_gpus(self) -> int:
        return torch.cuda.device_count() if torch.cuda.is_available() else 0

    def pick(self, value: Any, *, cpu: Any, gpu: Any) -> Any:
        """The notebook parameter if the user set it, else the profile's default."""
        if value is not None:
            return value
        return gpu if self.profile == "gpu" else cpu

    def path(self, name: str) -> Path:
        self.results_dir.mkdir(parents=True, exist_ok=True)
        return self.results_dir / name

    def save_table(self, df: pd.DataFrame, name: str, show: bool = True, precision: int = 3) -> pd.DataFrame:
        """CSV in the results folder and the table shown; returns `df` (end a cell's last call with `;`)."""
        df.to_csv(self.path(f"{name}.csv"), index=False)
        if show:
            _display(df.style.format(precision=precision, na_rep="–").hide(axis="index"))
        return df

    def save_json(self, obj: Any, name: str) -> Path:
        p = self.path(f"{name}.json")
        p.write_text(json.dumps(obj, indent=2, default=str))
        return p

    def save_figure(self, fig, name: str, show: bool = True) -> Path:
        import matplotlib.pyplot as plt

        self.figures_dir.mkdir(parents=True, exist_ok=True)
        p = self.figures_dir / f"{name}.png"
        fig.savefig(p, dpi=130, bbox_inches="tight")
        if show:
            _display(fig)
        plt.close(fig)
        return p

    def md(self, text: str) -> None:
        from IPython.display import Markdown

        _display(Markdown(text))

    def _append(self, filename: str, record: dict) -> None:
        p = self.path(filename)
        records = json.loads(p.read_text()) if p.exists() else []
        records = [
            r for r in records if not (r.get("notebook") == record["notebook"] and r.get("key") == record["key"])
        ]
        records.append(record)
        p.write_text(json.dumps(records, indent=2, default=str))

    def headline(self, key: str, value: Any, unit: str = "", note: str = "") -> None:
        """A number for the summary table at the top of the writeup."""
        self._append("headlines.json", dict(notebook=self.name, key=key, value=value, unit=unit, note=note))

    def not_run(self, part: str, reason: str) -> None:
        """A deliverable this machine cannot produce: shown here and listed in the writeup."""
        self._append("not_run.json", dict(notebook=self.name, key=part, reason=reason))
        self.md(f"> **Not run on this machine:** {part} — {reason}.")

    def answer(self, key: str, answer) -> None:
        """Records `answer` (a `report.answers.Answer`) to the deliverable key `key` for the writeups and
        shows it here: the text, then its table or figure."""
        from cs336_systems.report.answers import record_answer

        record_answer(self.results_dir, self.name, key, answer)
        if not answer.answered:
            self.md(f"> **{key}: not answered on this machine** — {answer.reason}.")
            return
        self.md(f"**Answer ({key}).** {answer.text}")
        if answer.table is not None:
            _display(answer.table.style.format(precision=3, na_rep="–").hide(axis="index"))
        if answer.figure:
            from IPython.display import Image

            _display(Image(filename=str(self.results_dir / answer.figure)))
        if answer.caveat:
            self.md(f"_{answer.caveat}_")

    def show_environment(self) -> None:
        rows = "\n".join(f"| {k} | {v} |" for k, v in self.env.items())
        self.md(f"| environment | |\n|---|---|\n{rows}")


def _display(obj) -> None:
    try:
        from IPython.display import display

        display(obj)
    except ImportError:  # plain Python, no IPython
        print(obj)


def setup_notebook(
    name: str, profile: str | None = None, results_dir: str | Path | None = None, show_env: bool = True
) -> NotebookContext:
    """Resolve the profile, create the results folder, set the plotting theme, show the environment.

    The results go to `$CS336_REPORT_DIR/results/`, which the report runner sets to the report folder
    (`reports/<profile>/`); a notebook run by hand writes to `reports/_scratch/<profile>/results/`,
    so exploring leaves the report as the runner wrote it."""
    profile = resolve_profile(profile)
    base = os.environ.get("CS336_REPORT_DIR")
    scratch = results_dir is None and not base
    if results_dir is None:
        results_dir = Path(base) / "results" if base else repo_root() / "reports" / "_scratch" / profile / "results"
    ctx = NotebookContext(name=name, profile=profile, results_dir=Path(results_dir), env=environment_info(profile))
    ctx.results_dir.mkdir(parents=True, exist_ok=True)
    try:
        import seaborn as sns

        sns.set_theme(context="notebook", style="whitegrid", palette="colorblind")
    except ImportError:
        pass
    if show_env:
        ctx.show_environment()
        if scratch:
            ctx.md(f"> Results go to the scratch folder `{ctx.results_dir}`; `make report` writes the report.")
    return ctx
