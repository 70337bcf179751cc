"""Mixed-precision experiments: accumulation error, the dtypes autocast produces, layer-norm sensitivity."""

from __future__ import annotations

import math

import pandas as pd
import torch
import torch.nn as nn

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "fp64": torch.float64}


def spacing(value: float, dtype: torch.dtype) -> float:
    """Distance between `value` and the next representable number of `dtype` (one ulp)."""
    mantissa_bits = {torch.float16: 10, torch.bfloat16: 7, torch.float32: 23, torch.float64: 52}[dtype]
    return 2.0 ** (math.floor(math.log2(abs(value))) - mantissa_bits)


def accumulate(accumulator: str, addend: str, upcast: bool = False, n: int = 1000, value: float = 0.01) -> float:
    """The handout's loop: s (dtype `accumulator`) += value (dtype `addend`, optionally upcast first)."""
    s = torch.tensor(0, dtype=DTYPES[accumulator])
    for _ in range(n):
        x = torch.tensor(value, dtype=DTYPES[addend])
        s += x.type(DTYPES[accumulator]) if upcast else x
    return s.item()


ACCUMULATION_CASES = [
    # (accumulator, addend, explicit upcast, from the handout)
    ("fp32", "fp32", False, True),
    ("fp16", "fp16", False, True),
    ("fp32", "fp16", False, True),
    ("fp32", "fp16", True, True),
    ("bf16", "bf16", False, False),
    ("fp32", "bf16", False, False),
    ("fp32", "bf16", True, False),
]


def accumulation_table(n: int = 1000, value: float = 0.01) -> pd.DataFrame:
    """Each loop's result, its error against n·value, and the addend as the addend dtype stores it."""
    rows = []
    exact = n * value
    for acc, add, upcast, handout in ACCUMULATION_CASES:
        result = accumulate(acc, add, upcast, n, value)
        stored = torch.tensor(value, dtype=DTYPES[add]).double().item()
        rows.append(
            dict(
                accumulator=acc,
                addend=add,
                explicit_upcast=upcast,
                in_handout=handout,
                result=result,
                abs_error=abs(result - exact),
                rel_error=abs(result - exact) / exact,
                addend_as_stored=stored,
                addend_rounding_error=stored - value,
                accumulator_spacing_at_result=spacing(exact, DTYPES[acc]),
            )
        )
    return pd.DataFrame(rows)


class ToyModel(nn.Module):
    """The handout's toy model: fc1 -> ReLU -> LayerNorm -> fc2."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.fc1 = nn.Linear(in_features, 10, bias=False)
        self.ln = nn.LayerNorm(10)
        self.fc2 = nn.Linear(10, out_features, bias=False)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.fc1(x))
        x = self.ln(x)
        return self.fc2(x)


def observe_autocast_dtypes(
    device: torch.device | str, dtype: torch.dtype = torch.float16, batch: int = 8
) -> pd.DataFrame:
    """Dtypes seen by forward hooks and after backward when ToyModel (fp32) runs under autocast(dtype)."""
    device = torch.device(device)
    torch.manual_seed(0)
    model = ToyModel(16, 4).to(device)
    x = torch.randn(batch, 16, device=device)
    y = torch.randint(0, 4, (batch,), device=device)
    seen: list[tuple[str, torch.dtype]] = []

    def record(name):
        def hook(module, inputs, output):
            if name == "fc1":
                seen.append(("model parameters inside autocast (fc1.weight)", module.weight.dtype))
            seen.append((f"output of {name}", output.dtype))

        return hook

    handles = [getattr(model, n).register_forward_hook(record(n)) for n in ("fc1", "ln", "fc2")]
    try:
        with torch.autocast(device_type=device.type, dtype=dtype):
            logits = model(x)
            loss = nn.functional.cross_entropy(logits, y)
        seen.append(("logits", logits.dtype))
        seen.append(("loss", loss.dtype))
        loss.backward()
    finally:
        for h in handles:
            h.remove()
    grad_dtypes = sorted({str(p.grad.dtype) for p in model.parameters()})
    rows = [dict(component=c, dtype=str(d).replace("torch.", "")) for c, d in seen]
    rows.append(
        dict(component="gradients (all parameters)", dtype=", ".join(g.replace("torch.", "") for g in grad_dtypes))
    )
    return pd.DataFrame(rows)


def layer_norm_steps(x: torch.Tensor, eps: float = 1e-5) -> dict[str, torch.Tensor]:
    """Layer norm written out in the dtype of x: mean, mean of squares, variance, normalised output."""
    eps_t = torch.tensor(eps, dtype=x.dtype)
    mean = x.mean(dim=-1, keepdim=True)
    sum_sq = (x * x).sum(dim=-1, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)
    out = (x - mean) / torch.sqrt(var + eps_t)
    return dict(mean=mean, sum_of_squares=sum_sq, variance=var, eps=eps_t, output=out)


def layer_norm_sensitivity(
    d_model: int = 1024, scales=(1.0, 16.0, 256.0, 4096.0), offsets=(0.0, 100.0), seed: int = 0
) -> pd.DataFrame:
    """Each step of layer norm in fp16 / bf16 / fp32 against fp64, for inputs of growing scale and offset.

    Shows where low precision breaks: sums of squares overflow fp16's 65504, the variance of an
    offset input cancels catastrophically, and eps=1e-5 is below fp16's smallest normal number.
    """
    g = torch.Generator().manual_seed(seed)
    rows = []
    for scale in scales:
        for offset in offsets:
            x64 = torch.randn(4, d_model, generator=g, dtype=torch.float64) * scale + offset
            ref = layer_norm_steps(x64)
            for name in ("fp16", "bf16", "fp32"):
                steps = layer_norm_steps(x64.to(DTYPES[name]))
                row = dict(input_scale=scale, input_offset=offset, dtype=name)
                for step in ("sum_of_squares", "variance", "output"):
                    got = steps[step].double()
                    finite = bool(torch.isfinite(got).all())
                    err = ((got - ref[step]).norm() / ref[step].norm()).item() if finite else float("inf")
                    row[f"{step}_rel_error"] = err
                row["eps_as_stored"] = steps["eps"].double().item()
                row["output_finite"] = bool(torch.isfinite(steps["output"]).all())
                rows.append(row)
    return pd.DataFrame(rows)
