"""Two small models that exercise the awkward cases of data-parallel wrappers, for tests and demos.

Both map a batch of shape (batch, 10) to (batch, 5).

- `ToyModel`: two bias-free linear layers around a LayerNorm.
- `ToyModelWithTiedWeights`: `fc4.weight` *is* `fc2.weight` (one Parameter used twice, so its
  gradient accumulates from two places and must be communicated once), a frozen parameter
  (`requires_grad=False`, never communicated or updated) and a random buffer (`input_shift`,
  which only matches across ranks if the wrapper broadcasts buffers as well as parameters).
"""

from __future__ import annotations

import torch
import torch.nn as nn

IN_FEATURES = 10
OUT_FEATURES = 5


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(IN_FEATURES, 10, bias=False)
        self.ln = nn.LayerNorm(10)
        self.fc2 = nn.Linear(10, OUT_FEATURES, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.ln(torch.relu(self.fc1(x))))


class ToyModelWithTiedWeights(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(IN_FEATURES, 10)
        self.fc2 = nn.Linear(10, 50)
        self.fc3 = nn.Linear(50, 10)
        self.fc4 = nn.Linear(10, 50)
        self.fc5 = nn.Linear(50, OUT_FEATURES)
        self.fc4.weight = self.fc2.weight
        self.no_grad_fixed_param = nn.Parameter(torch.tensor([2.0, 2.0]), requires_grad=False)
        self.register_buffer("input_shift", torch.randn(IN_FEATURES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.fc1(x - self.input_shift))
        x = torch.relu(self.fc2(x))
        x = torch.relu(self.fc3(x))
        x = torch.relu(self.fc4(x))
        return self.fc5(x) * self.no_grad_fixed_param[0]
