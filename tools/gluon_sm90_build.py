"""Build the fused Gluon backward at head dimension 128 for Hopper (sm_90a) on a machine without a GPU, and
report what ptxas made of it: registers, spill bytes, ptxas's advisory that it serialised every wgmma of
the kernel (C7515), and per loop of the SASS its instructions, wgmma, spill stores and reloads, and
warpgroup barriers. How the tuning record's d = 128 backward candidates were vetted before any GPU run
(docs/flash_attention_tuning.md).

    python tools/gluon_sm90_build.py [--variant PATH] [--no-causal] [--stages 2] [--regs 240,24]
        [--dtype bfloat16] [--heads 32] [--seq-len 32768] [--keep DIR]

The kernel is built as `flash_gluon.backward_launch` would launch it on (heads, N, 128) inputs, by default the
2026 leaderboard's attention shape (the shape sets the constexpr SECTION, `heuristics.heads_per_section`).

A variant is a module defining `flash_bwd_gluon_d128_kernel` with the shipped kernel's signature, as for
tools/flash_d128_bench.py. Exits 1 where ptxas serialised the kernel's wgmma. Triton compiles through a
stand-in driver that reports an H100 (written against Triton 3.6's driver classes) and its bundled ptxas
and cuobjdump; nothing is launched.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.driver import CudaDriver, CudaLauncher

from cs336_systems.attention import heuristics
from cs336_systems.attention.launch import gluon as flash_gluon

TOOLS = Path(triton.backends.nvidia.__file__).parent / "bin"


class HopperStandIn(CudaDriver):
    """Triton's CUDA driver without libcuda: an H100's properties, the current target sm_90, no launches."""

    def __init__(self):
        self.launcher_cls = CudaLauncher

        class Utils:
            def get_device_properties(self, device):
                return {
                    "max_shared_mem": 232448,
                    "multiprocessor_count": 132,
                    "max_num_regs": 65536,
                    "warpSize": 32,
                    "sm_clock_rate": 1,
                    "mem_clock_rate": 1,
                    "mem_bus_width": 1,
                }

            def load_binary(self, *args):
                raise RuntimeError("the stand-in driver builds kernels; it cannot load them")

        self.utils = Utils()

    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_active_torch_device(self):
        return torch.device("cpu")

    @staticmethod
    def is_active():
        return True


def build(
    kernel, causal: bool, stages: int, regs: tuple[int, int], dtype: torch.dtype, heads: int, n: int
) -> tuple[int, str]:
    """SECTION and the kernel's PTX, as `flash_gluon.backward_launch` would launch it on (heads, n, 128)
    tensors: its arguments, descriptors and constexprs (SECTION included, which follows the shape) are the
    library's. The tensors are CPU ones that are never touched: only their types, strides and alignment
    matter."""
    d = 128
    q, k, v, do, dk, dv = (torch.empty(heads, n, d, dtype=dtype) for _ in range(6))
    lse, delta, dq_acc = torch.empty(heads, n), torch.empty(heads, n), torch.empty(heads, n, d)
    q_tile, k_half, _ = heuristics.GLUON_BWD_TILES[d]
    section = heuristics.gluon_sections(n, d, dtype.itemsize, heads, causal)[1]
    launch = flash_gluon.backward_launch(
        q, k, v, do, lse, delta, dk, dv, dq_acc, causal, section, (q_tile, k_half, stages), regs, kernel
    )
    return launch.options["SECTION"], launch.kernel.warmup(*launch.args, grid=launch.grid, **launch.options).asm["ptx"]


def loops(sass: str) -> list[dict]:
    """Per backward branch of the SASS (a loop, or a wait's retry jumping back across code), counts of what
    the instructions from its target to the branch hold."""
    instructions = [
        (int(m.group(1), 16), m.group(2))
        for m in (re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?);", line) for line in sass.splitlines())
        if m
    ]
    found = []
    for address, text in instructions:
        branch = re.search(r"BRA.*0x([0-9a-f]+)", text)
        if branch and int(branch.group(1), 16) < address:
            start = int(branch.group(1), 16)
            body = [t for a, t in instructions if start <= a <= address]
            count = lambda s: sum(s in t for t in body)  # noqa: E731
            found.append(
                dict(
                    start=hex(start),
                    end=hex(address),
                    instructions=len(body),
                    wgmma=count("HGMMA"),
                    spill_stores=count("STL"),
                    spill_reloads=count("LDL"),
                    barriers=count("BAR.SYNC"),
                )
            )
    return found


# The loops over query tiles: a visit issues 32 wgmma instructions (S and dP: 8 k-steps of 16 over d = 128
# each; dV and dK: 4 over 64 queries; the dQ part: 2 products of 4 over 64 keys), once per consumer
# warpgroup and for the unmasked and the masked visits.
VISIT_WGMMA = 32


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", help="a module defining flash_bwd_gluon_d128_kernel")
    parser.add_argument("--no-causal", action="store_true")
    parser.add_argument("--stages", type=int, default=heuristics.GLUON_BWD_TILES[128][2])
    parser.add_argument("--regs", default=",".join(map(str, heuristics.GLUON_BWD_REGS[128])))
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    parser.add_argument("--heads", type=int, default=32, help="batch·heads (default: the 2026 leaderboard's)")
    parser.add_argument("--seq-len", type=int, default=32768)
    parser.add_argument("--keep", help="a folder for the PTX, cubin and SASS")
    parser.add_argument("--all-loops", action="store_true", help="every backward branch, not only the visit loops")
    args = parser.parse_args()
    if args.variant:
        spec = importlib.util.spec_from_file_location("variant", args.variant)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        from cs336_systems.attention.kernels import gluon_backward_d128 as module
    triton.runtime.driver.set_active(HopperStandIn())
    regs = tuple(int(x) for x in args.regs.split(","))
    section, ptx = build(
        module.flash_bwd_gluon_d128_kernel,
        not args.no_causal,
        args.stages,
        regs,
        getattr(torch, args.dtype),
        args.heads,
        args.seq_len,
    )

    out = Path(args.keep or tempfile.mkdtemp(prefix="gluon_sm90_"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernel.ptx").write_text(ptx)
    ptxas = subprocess.run(
        [TOOLS / "ptxas", "-v", "--gpu-name", "sm_90a", out / "kernel.ptx", "-o", out / "kernel.cubin"],
        capture_output=True,
        text=True,
        check=True,
    ).stderr
    sass = subprocess.run(
        [TOOLS / "cuobjdump", "-sass", out / "kernel.cubin"], capture_output=True, text=True, check=True
    ).stdout
    (out / "kernel.sass").write_text(sass)
    registers = re.search(r"Used (\d+) registers", ptxas)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", ptxas)
    serialised = [line.split(": ", 1)[-1] for line in ptxas.splitlines() if "C7515" in line]
    print(
        f"{args.variant or 'shipped'}: causal={not args.no_causal} stages={args.stages} regs={regs} {args.dtype} "
        f"heads={args.heads} N={args.seq_len} SECTION={section}"
    )
    print(
        f"  ptxas: {registers.group(1)} registers at launch; spills {spills.group(1)} bytes stored, "
        f"{spills.group(2)} loaded"
    )
    for loop in (x for x in loops(sass) if args.all_loops or x["wgmma"] == VISIT_WGMMA):
        print(
            "  loop {start}-{end}: {instructions} instructions, {wgmma} wgmma, {spill_stores} spill stores, "
            "{spill_reloads} reloads, {barriers} barriers".format(**loop)
        )
    print(f"  files in {out}")
    if serialised:
        print("  SERIALISED: " + serialised[0])
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
