"""tools/gluon_sm90_build.py builds the fused d = 128 Gluon backward for Hopper without a GPU: the shipped
kernel compiles for sm_90a with its wgmma asynchronous (ptxas does not serialise them), as the library's
launch builds it (one head after another at the 2026 shape, heads in sections at shorter causal ones), and
the tool reports the loops over query tiles. Runs in a subprocess: the test session sets TRITON_INTERPRET, under
which nothing is compiled."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cs336_systems.attention import heuristics

ROOT = Path(__file__).resolve().parents[1]

triton = pytest.importorskip("triton")
PTXAS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"


def build(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT / "lib") + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gluon_sm90_build.py"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


@pytest.mark.skipif(not PTXAS.exists(), reason="triton's bundled ptxas is missing (not a Linux wheel)")
@pytest.mark.parametrize(
    "causal, shape",
    [(True, []), (False, []), (True, ["--heads", "16", "--seq-len", "4096"])],
    ids=["causal", "full", "causal-in-sections"],
)
def test_the_shipped_d128_backward_builds_for_hopper_with_asynchronous_wgmma(causal, shape):
    result = build(*([] if causal else ["--no-causal"]), *shape)
    assert result.returncode == 0, result.stdout + result.stderr
    heads, n = (16, 4096) if shape else (32, 32768)
    section = heuristics.heads_per_section(n, 128, 2, heads, 128, causal)
    assert section == (4 if shape else 1)  # the library's order, which the build follows
    assert f"SECTION={section}" in result.stdout
    assert "SERIALISED" not in result.stdout
    visit_loops = [line for line in result.stdout.splitlines() if line.strip().startswith("loop ")]
    # one loop over unmasked visits per consumer warpgroup, and under the mask one more each
    assert len(visit_loops) == (4 if causal else 2), result.stdout


def visit_counts(stdout: str) -> list[dict[str, int]]:
    """The tool's per-loop counts, in the SASS's order."""
    pattern = re.compile(r"loop \S+: (\d+) instructions, (\d+) wgmma, (\d+) spill stores, (\d+) reloads")
    return [
        dict(zip(("instructions", "wgmma", "spill_stores", "reloads"), map(int, m.groups())))
        for m in pattern.finditer(stdout)
    ]


@pytest.mark.skipif(not PTXAS.exists(), reason="triton's bundled ptxas is missing (not a Linux wheel)")
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_the_d128_backwards_unmasked_visits_spill_nothing(causal):
    """P^T and dS^T as register operands and L, D read from the slot where used leave the loops that run
    nearly every visit without spill stores (and, under the mask, without reloads); earlier layouts spilled
    in them (docs/flash_attention_tuning.md, the d = 128 backward)."""
    result = build(*([] if causal else ["--no-causal"]))
    assert result.returncode == 0, result.stdout + result.stderr
    loops = visit_counts(result.stdout)
    # each consumer's unmasked loop comes first in the SASS, its masked loop (causal only) after it
    unmasked = loops[0::2] if causal else loops
    assert len(unmasked) == 2 and all(loop["wgmma"] == 32 for loop in unmasked), result.stdout
    assert all(loop["spill_stores"] == 0 for loop in unmasked), result.stdout
    if causal:
        assert all(loop["reloads"] == 0 for loop in unmasked), result.stdout
