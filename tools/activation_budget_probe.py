"""One compiled 8B block at context 32,768 under torch.compile's activation memory budgets: what it holds
for its backward and its working memory (`measure_block_memory`), and its forward+backward time
(`do_bench`). How `leaderboard_8b.ACTIVATION_MEMORY_BUDGET` was chosen (docs/leaderboard_8b_record.md).

    PYTHONPATH=lib python tools/activation_budget_probe.py [--budgets 1.0 0.8 0.6 0.5 0.3] [--context 32768]
"""

import argparse

import torch
import torch._functorch.config as functorch_config  # the partitioner's budget
import triton.testing

from cs336_systems.model import TransformerBlock
from cs336_systems.training.leaderboard_8b import D_FF, D_MODEL, HEADS
from cs336_systems.training.memory_plan import measure_block_memory


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--budgets", type=float, nargs="+", default=[1.0, 0.8, 0.6, 0.5, 0.3])
    p.add_argument("--context", type=int, default=32_768)
    args = p.parse_args()
    n = args.context

    def make() -> TransformerBlock:
        return TransformerBlock(D_MODEL, HEADS, D_FF, n, attention="flash_triton", device="cuda", dtype=torch.bfloat16)

    torch.manual_seed(0)
    weights = make().state_dict()
    x = torch.randn(1, n, D_MODEL, device="cuda", dtype=torch.bfloat16)
    grad = torch.randn_like(x)
    for budget in args.budgets:
        torch._dynamo.reset()
        with functorch_config.patch(activation_memory_budget=budget):
            block = make()
            block.load_state_dict(weights)
            block.compile()
            saved, transient = measure_block_memory(block, x)
            inp = x.detach().requires_grad_()
            ms = triton.testing.do_bench(lambda: block(inp).backward(grad), rep=1500, warmup=300)
        print(
            f"budget {budget}: saved {saved / 2**30:.3f} GiB, working {transient / 2**30:.3f} GiB, "
            f"forward+backward {ms:.2f} ms",
            flush=True,
        )
        block = None  # frees it before the next budget's block (a `del` would unbind the name the timed lambda reads)


if __name__ == "__main__":
    main()
