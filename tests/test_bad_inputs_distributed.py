"""Bad inputs to the distributed wrappers and to the command-line tools: each is refused, naming the problem;
and a model the wrappers must take, a biased torch.nn.Linear under FSDP's compute dtype.

One 2-rank gloo job runs every distributed case and returns messages and numbers; the asserts are here.
"""

from __future__ import annotations

import copy
import os
import stat
import subprocess
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from cs336_systems.distributed import FSDP, DDPBucketed, DDPFlat, DDPIndividualParameters, DDPNaive, DDPShardedGradients
from cs336_systems.distributed.launch import DistContext, spawn

ROOT = Path(__file__).resolve().parents[1]

WRAPPERS = {
    "naive": DDPNaive,
    "flat": DDPFlat,
    "individual": DDPIndividualParameters,
    "bucketed": lambda m: DDPBucketed(m, None),
    "sharded-gradients": lambda m: DDPShardedGradients(m, {p: 0 for p in m.parameters()}, None),
    "fsdp": FSDP,
}


def _two_layers(rank: int, case: str) -> nn.Module:
    """The same model on every rank but for `case` on rank 1."""
    torch.manual_seed(0)
    out = 3 if case == "shape" and rank == 1 else 2
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, out))
    if case == "dtype" and rank == 1:
        model[1].double()
    if case == "extra" and rank == 1:
        model.append(nn.Linear(2, 2))
    return model


def _error(build) -> str:
    try:
        build()
    except ValueError as err:
        return str(err)
    return "accepted"


def _mismatches(ctx: DistContext) -> dict[str, str]:
    out = {f"shape/{name}": _error(lambda: wrap(_two_layers(ctx.rank, "shape"))) for name, wrap in WRAPPERS.items()}
    out["dtype"] = _error(lambda: DDPNaive(_two_layers(ctx.rank, "dtype")))
    out["extra"] = _error(lambda: DDPNaive(_two_layers(ctx.rank, "extra")))
    out["same"] = _error(lambda: DDPNaive(_two_layers(ctx.rank, "same")))  # the group still works after the errors
    return out


def _linear_with_bias_in_bf16(ctx: DistContext) -> dict:
    """FSDP(compute_dtype=bf16) on torch.nn.Linear layers with biases against bf16 autocast on the whole batch."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    reference, start = copy.deepcopy(model), copy.deepcopy(model)
    x = torch.randn(4 * ctx.world_size, 8, generator=torch.Generator().manual_seed(1))
    mine = slice(4 * ctx.rank, 4 * (ctx.rank + 1))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = reference(x)
    expected.float().pow(2).mean().backward()
    torch.optim.SGD(reference.parameters(), lr=1.0).step()
    try:
        fsdp = FSDP(model, compute_dtype=torch.bfloat16)
        output = fsdp(x[mine])
        output.float().pow(2).mean().backward()
        fsdp.finish_gradient_synchronization()
    except RuntimeError as err:
        return {"error": str(err)}
    bias_grads = [p.grad for n, p in fsdp.module.named_parameters() if n.endswith("bias")]
    torch.optim.SGD(fsdp.parameters(), lr=1.0).step()
    full = fsdp.gather_full_params()
    scale = lambda t: t.abs().max().item()  # noqa: E731
    # lr = 1: each parameter moved by minus its gradient
    moved = {
        n: (p.detach() - full[n], p.detach() - dict(reference.named_parameters())[n])
        for n, p in start.named_parameters()
    }
    return {
        "error": None,
        "output_dtype": str(output.dtype),
        "output_diff": scale(output.float() - expected[mine].float()) / scale(expected),
        "bias_grad_dtypes": sorted({str(g.dtype) for g in bias_grads if g is not None}),
        "grad_diff": {n: scale(ours - theirs) / scale(theirs) for n, (ours, theirs) in moved.items()},
    }


def _worker(ctx: DistContext) -> dict:
    torch.set_num_threads(1)
    return {"mismatches": _mismatches(ctx), "bf16": _linear_with_bias_in_bf16(ctx)}


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    return spawn(_worker, 2, backend="gloo", timeout_s=120)


@pytest.mark.multiprocess
def test_parameters_that_differ_between_ranks_are_refused_at_wrap_time_on_every_rank(ranks):
    for case in [f"shape/{name}" for name in WRAPPERS]:
        messages = [r["mismatches"][case] for r in ranks]
        assert messages[0] == messages[1], f"{case}: the ranks disagree: {messages}"
        m = messages[0]
        assert "'1.weight'" in m and "rank 0: (2, 4) torch.float32" in m and "rank 1: (3, 4) torch.float32" in m, (
            f"{case}: {m}"
        )
    m = ranks[1]["mismatches"]["dtype"]
    assert "'1.weight'" in m and "rank 0: (2, 4) torch.float32" in m and "rank 1: (2, 4) torch.float64" in m, m
    m = ranks[0]["mismatches"]["extra"]
    assert "'2.weight'" in m and "rank 0: missing" in m and "rank 1: (2, 2) torch.float32" in m, m
    assert [r["mismatches"]["same"] for r in ranks] == ["accepted"] * 2


@pytest.mark.multiprocess
def test_fsdp_in_bf16_computes_a_linear_with_bias_and_keeps_its_gradient_fp32(ranks):
    for rank, results in enumerate(ranks):
        r = results["bf16"]
        assert r["error"] is None, f"rank {rank}: {r['error']}"
        assert r["output_dtype"] == "torch.bfloat16" and r["bias_grad_dtypes"] == ["torch.float32"]
        # bf16 keeps 8 significant bits: a rounding is up to 2^-8 ≈ 0.4% of the value
        assert r["output_diff"] <= 1e-2, f"rank {rank}: output {r['output_diff']:.3g} of its scale from autocast's"
        bad = {n: d for n, d in r["grad_diff"].items() if not d <= 1e-2}
        assert not bad, f"rank {rank}: gradients differ from bf16 autocast's by these shares of their scale: {bad}"


# ---- the command-line tools -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "script, args",
    [
        ("course_suite.sh", []),
        ("gpu_node_report.sh", []),
        ("gpu_node_report.sh", ["09", "600"]),
        ("gpu_node_report.sh", ["09", "ten minutes", "gpu.tgz"]),
    ],
)
def test_tools_without_their_arguments_print_usage(tmp_path, script, args):
    # In an empty folder: were the arguments taken, nothing there could be run or packed.
    done = subprocess.run(
        ["bash", str(ROOT / "tools" / script), *args], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "usage" in (done.stdout + done.stderr).lower()
    assert "unbound variable" not in done.stderr


def test_a_course_checkout_without_tests_is_named(tmp_path):
    done = subprocess.run(
        ["bash", str(ROOT / "tools" / "course_suite.sh"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 2 and f"{tmp_path} has no tests/" in done.stderr, done.stderr


@pytest.mark.parametrize("uid, allow_root", [("0", True), ("1000", False)])
def test_make_lab_lets_root_start_jupyter(tmp_path, uid, allow_root):
    fake_id = tmp_path / "id"
    fake_id.write_text(f"#!/bin/sh\necho {uid}\n")
    fake_id.chmod(fake_id.stat().st_mode | stat.S_IEXEC)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    done = subprocess.run(
        ["make", "-n", "lab", "PYTHON=python3"], capture_output=True, text=True, timeout=60, cwd=ROOT, env=env
    )
    assert done.returncode == 0, done.stderr
    lab = [line for line in done.stdout.splitlines() if "jupyter lab" in line]
    assert len(lab) == 1 and ("--allow-root" in lab[0]) == allow_root, done.stdout
    assert "cd notebooks && python3 -m jupyter lab" in lab[0], "a PYTHON found on PATH must stay a bare name"
