"""Run attention benchmark configurations in this (fresh) process; print each row as a JSON line.

    python -m cs336_systems.experiments.attention_benchmark_worker '{"implementations": {"naive": "naive"},
        "d_model": 64, "runs": [[1024, "naive"], [2048, "naive"]], "settings": {"batch": 8,
        "device": "cuda", "dtype": "float32", "is_causal": false, "warmup": 5, "steps": 100,
        "memory_budget_bytes": null}}'

`attention_sweep` starts it (through `run_in_subprocess`) so that an out-of-memory, and whatever
it leaves on the device, ends with the process: the worker stops after the first OOM row.
"""

from __future__ import annotations

import json
import sys

import torch

from cs336_systems.experiments.attention_benchmark import (
    CudaMemoryCap,
    allocate_library_workspaces,
    resolve_implementation,
    run_in_process,
)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        raise ValueError("benchmark_worker takes one argument, the job as JSON")
    job = json.loads(argv[0])
    settings = dict(job["settings"])
    settings["device"] = device = torch.device(settings["device"])
    settings["dtype"] = getattr(torch, settings["dtype"])
    implementations = {label: resolve_implementation(spec) for label, spec in job["implementations"].items()}
    allocate_library_workspaces(device)
    with CudaMemoryCap(device, settings["memory_budget_bytes"]):
        for row in run_in_process(implementations, job["d_model"], [tuple(r) for r in job["runs"]], settings):
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
