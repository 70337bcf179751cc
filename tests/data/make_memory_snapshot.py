"""Writes memory_snapshot_example.pickle (+ .phases.json): a synthetic CUDA memory snapshot.

It has the structure torch.cuda.memory._dump_snapshot() writes (segments with blocks, and
device_traces with alloc / free_requested / free_completed entries carrying time_us and Python
frames, innermost first), for a made-up 2-layer training step, so the parser and the figure can
be tested without a GPU. Sizes in MiB, chosen so the peak is easy to add up by hand:

  before recording: 4 parameters x 8 + 2 optimizer-state blocks x 32 = 96 MiB, plus the previous
    batch (1 MiB), freed by the first event
  forward, per layer: linear output 4 (kept), attention scores 16 (kept), softmax probs 16 (kept),
    a 2 MiB temporary (freed at once); then logits 20 (kept)
  backward: 4 gradients x 8 (kept), a 16 MiB temporary per layer (freed at once); the forward
    activations are freed layer by layer
  optimizer: an 8 MiB temporary per parameter (freed at once), then the gradients are freed

The peak is reached at the start of the backward pass, while the first 16 MiB temporary is
alive: 96 + 72 (activations) + 20 (logits) + 8 (first gradient) + 16 (temporary) = 212 MiB.

Run:  python tests/data/make_memory_snapshot.py
"""

import json
import pickle
from pathlib import Path

MIB = 2**20
HERE = Path(__file__).parent
SITE = "/usr/lib/python3.12/site-packages"
MODULE_CALL = [{"filename": f"{SITE}/torch/nn/modules/module.py", "line": 1786, "name": "_call_impl"}]
HARNESS = [{"filename": "/repo/lib/cs336_systems/benchmarking/harness.py", "line": 119, "name": "step"}]


def frames(filename: str, line: int, name: str, via_torch: bool = False) -> list[dict]:
    inner = [{"filename": f"{SITE}/torch/_tensor.py", "line": 41, "name": "wrapped"}] if via_torch else []
    return (
        inner
        + [{"filename": f"/repo/lib/cs336_systems/{filename}", "line": line, "name": name}]
        + MODULE_CALL
        + HARNESS
    )


LINEAR = frames("model.py", 68, "forward")
SCORES = frames("attention/naive.py", 21, "naive_attention", via_torch=True)
PROBS = frames("nn_utils.py", 14, "softmax")
TEMP = frames("model.py", 128, "forward")
OPTIM = [
    {"filename": "/repo/lib/cs336_systems/optim.py", "line": 65, "name": "step"},
    {"filename": f"{SITE}/torch/optim/optimizer.py", "line": 516, "name": "wrapper"},
] + HARNESS


def build() -> tuple[dict, list[dict]]:
    trace: list[dict] = []
    clock = [1_700_000_000_000_000]
    next_addr = [0x7F0000000000]

    def event(action: str, addr: int, size: int, frames_: list) -> None:
        clock[0] += 10
        trace.append(
            {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": clock[0], "frames": frames_}
        )

    def alloc(size_mib: float, frames_: list) -> int:
        addr = next_addr[0]
        next_addr[0] += int(size_mib * MIB)
        event("alloc", addr, int(size_mib * MIB), frames_)
        return addr

    def free(addr: int, size_mib: float) -> None:
        event("free_requested", addr, int(size_mib * MIB), [])
        event("free_completed", addr, int(size_mib * MIB), [])

    params = [0x7E0000000000 + i * 8 * MIB for i in range(4)]
    optim_state = [0x7E0000000000 + 32 * MIB + i * 32 * MIB for i in range(2)]
    previous_batch = 0x7E0000000000 + 96 * MIB
    phases = []

    def phase(name: str, start: int) -> None:
        phases.append({"name": name, "start_us": start, "end_us": clock[0] + 5})

    start = clock[0] + 5
    free(previous_batch, 1)
    activations = []
    for _ in range(2):
        layer = [(alloc(4, LINEAR), 4), (alloc(16, SCORES), 16), (alloc(16, PROBS), 16)]
        tmp = alloc(2, TEMP)
        free(tmp, 2)
        activations.append(layer)
    logits = alloc(20, LINEAR)
    phase("forward", start)

    start = clock[0] + 5
    grads = [alloc(8, [])]
    for layer in reversed(activations):
        tmp = alloc(16, [])
        free(tmp, 16)
        for addr, size in layer:
            free(addr, size)
        if len(grads) < 4:
            grads.append(alloc(8, []))
    free(logits, 20)
    while len(grads) < 4:
        grads.append(alloc(8, []))
    phase("backward", start)

    start = clock[0] + 5
    for _ in params:
        tmp = alloc(8, OPTIM)
        free(tmp, 8)
    for g in grads:
        free(g, 8)
    phase("optimizer step", start)

    blocks = [
        {"address": a, "size": 8 * MIB, "requested_size": 8 * MIB, "state": "active_allocated", "frames": []}
        for a in params
    ]
    blocks += [
        {"address": a, "size": 32 * MIB, "requested_size": 32 * MIB, "state": "active_allocated", "frames": []}
        for a in optim_state
    ]
    segment = {
        "device": 0,
        "address": 0x7E0000000000,
        "total_size": 128 * MIB,
        "allocated_size": 96 * MIB,
        "active_size": 96 * MIB,
        "requested_size": 96 * MIB,
        "stream": 0,
        "segment_type": "large",
        "segment_pool_id": (0, 0),
        "is_expandable": False,
        "frames": [],
        "blocks": blocks,
    }
    return {"segments": [segment], "device_traces": [trace], "allocator_settings": {}}, phases


if __name__ == "__main__":
    snapshot, phases = build()
    with open(HERE / "memory_snapshot_example.pickle", "wb") as f:
        pickle.dump(snapshot, f)
    (HERE / "memory_snapshot_example.phases.json").write_text(json.dumps(phases, indent=1))
