"""An optimizer's state kept in host memory between its steps, its device memory free for the forward.

AdamW's two moments are only read and written by the update. Between updates they can live in the host's
memory, which frees their bytes on the GPU for what the forward and backward hold (a training step's
recompute plan gives them to saved activations: `StepConfig.offload_optimizer_states`):

    offload = StateOffload(optimizer)   # from now on, after each step the moments go to the host
    ...                                 # forward, backward
    offload.fetch()                     # start bringing them back (a training step does it mid-backward)
    optimizer.step()                    # waits for them; then they go back to the host

With `after_step=False` they go only when `offload()` is called: a training step calls it after its next
batch's host sync (the token-id check reads a few numbers back, and a read-back queued on the copy engine
behind gigabytes of states waits for all of them, and the host with it: the next step starts that much later).

What moves is every tensor of `optimizer.state` that lives on a CUDA device and has more than one element
(AdamW's `exp_avg`, `exp_avg_sq`; the step counters stay where they are). The copies run on a side stream,
overlapping the compute of the current one:

- after `optimizer.step()` (a step post-hook), or at `offload()`: the side stream waits for the current
  stream's work so far (the update), copies each moment into its slice of one pinned host buffer, and the
  state entry becomes that host tensor. The device tensor is released at once; the allocator hands its memory
  out again only once the copy has read it (`Tensor.record_stream`), so the forward gets it back as the
  copies finish.
- `fetch()`: each moment gets a new device tensor (allocated on the current stream, in its order) that the
  side stream fills from the host buffer after the current stream's work so far; the state entry becomes it.
- before `optimizer.step()` (a step pre-hook): `fetch()` if nobody did, then the current stream waits for the
  side stream. Nothing else ever waits: without a `fetch()` ahead of the step the copy back is simply not
  overlapped.

`state_dict()` and `load_state_dict()` first wait for the copies in flight (hooks as well), so a checkpoint
between steps reads the moments from the host; a loaded state is on the device until the next step sends it
to the host. The values never change: a round trip is a copy, bit for bit. On CPU (no CUDA device among the
states) nothing moves.
"""

from __future__ import annotations

import torch

ALIGN = 256  # bytes: each moment's slice of the host buffer starts at a multiple, whatever its dtype


class StateOffload:
    """Keeps `optimizer`'s device state tensors in pinned host memory between steps (module docstring): sent
    there after each step, or with `after_step=False` whenever `offload()` is called. One per optimizer; it
    installs hooks on the optimizer and lives as long as it does."""

    def __init__(self, optimizer: torch.optim.Optimizer, after_step: bool = True):
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"StateOffload needs a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if not isinstance(after_step, bool):
            raise TypeError(f"StateOffload: after_step must be a bool, got {type(after_step).__name__}")
        self.optimizer = optimizer
        self.host: torch.Tensor | None = None  # one pinned buffer holding every moment while it is away
        self.layout: tuple = ()  # (param id, key, shape, dtype, offset) of each moment in `host`
        self.away: list[tuple[torch.Tensor, str, torch.Tensor]] = []  # (param, key, host view) not on the device
        self.fetched: list[tuple[torch.Tensor, str, torch.Tensor]] = []  # brought back, not yet waited for
        self.streams: dict[torch.device, torch.cuda.Stream] = {}
        self.copy_done: dict[torch.device, torch.cuda.Event] = {}
        optimizer.register_step_pre_hook(lambda *_: self.ready())
        if after_step:
            optimizer.register_step_post_hook(lambda *_: self.offload())
        optimizer.register_state_dict_pre_hook(lambda *_: self.settle())
        optimizer.register_load_state_dict_pre_hook(lambda *_: self.settle())
        optimizer.register_load_state_dict_post_hook(lambda *_: self.forget())

    @property
    def offloaded_bytes(self) -> int:
        """Bytes of optimizer state now away from the device."""
        return sum(view.numel() * view.element_size() for _, _, view in self.away)

    def device_states(self) -> list[tuple[torch.Tensor, str, torch.Tensor]]:
        """(parameter, key, tensor) of every state tensor that moves: on a CUDA device, more than one element."""
        return [
            (p, key, value)
            for p, state in self.optimizer.state.items()
            for key, value in state.items()
            if torch.is_tensor(value) and value.is_cuda and value.numel() > 1
        ]

    def offload(self) -> None:
        """Send the device states to the host (after the update that just ran on the current stream)."""
        self.fetched = []
        moving = self.device_states()
        if not moving:
            return
        views = self.host_views(moving)
        for device in {t.device for _, _, t in moving}:
            self.side_stream(device).wait_stream(torch.cuda.current_stream(device))
        for (p, key, tensor), view in zip(moving, views):
            stream = self.side_stream(tensor.device)
            with torch.cuda.stream(stream):
                view.copy_(tensor, non_blocking=True)
            tensor.record_stream(stream)  # its memory is reused only after the copy has read it
            self.optimizer.state[p][key] = view
            self.away.append((p, key, view))
        self.record_copies()

    def fetch(self) -> None:
        """Start bringing the states back to their parameters' devices (a no-op when none is away)."""
        if not self.away:
            return
        for device in {p.device for p, _, _ in self.away}:
            self.side_stream(device).wait_stream(torch.cuda.current_stream(device))
        for p, key, view in self.away:
            tensor = torch.empty(view.shape, dtype=view.dtype, device=p.device)
            stream = self.side_stream(p.device)
            with torch.cuda.stream(stream):
                tensor.copy_(view, non_blocking=True)
            tensor.record_stream(stream)
            self.optimizer.state[p][key] = tensor
            self.fetched.append((p, key, tensor))
        self.away = []
        self.record_copies()

    def ready(self) -> None:
        """The states on the device, the current stream ordered after their copies: the update may run."""
        self.fetch()
        for device in {p.device for p, _, _ in self.fetched}:
            torch.cuda.current_stream(device).wait_stream(self.side_stream(device))
        self.fetched = []

    def settle(self) -> None:
        """Wait (the host) for every copy in flight, so that the state entries may be read anywhere."""
        for event in self.copy_done.values():
            event.synchronize()

    def forget(self) -> None:
        """After a load: the loaded states are where the optimizer put them; none is away any more."""
        self.away, self.fetched = [], []

    def side_stream(self, device: torch.device) -> torch.cuda.Stream:
        if device not in self.streams:
            self.streams[device] = torch.cuda.Stream(device)
        return self.streams[device]

    def record_copies(self) -> None:
        for device, stream in self.streams.items():
            self.copy_done[device] = stream.record_event()

    def host_views(self, moving: list[tuple[torch.Tensor, str, torch.Tensor]]) -> list[torch.Tensor]:
        """Each moving tensor's slice of the pinned host buffer, (re)made when the set of states changes."""
        layout, offset = [], 0
        for p, key, t in moving:
            layout.append((id(p), key, tuple(t.shape), t.dtype, offset))
            offset += -(-t.numel() * t.element_size() // ALIGN) * ALIGN
        if tuple(layout) != self.layout:
            self.settle()  # the old buffer may still be in a copy
            self.host = torch.empty(offset, dtype=torch.uint8, pin_memory=True)
            self.layout = tuple(layout)
        return [
            self.host[start : start + t.numel() * t.element_size()].view(t.dtype).view(t.shape)
            for (_, _, t), (*_, start) in zip(moving, layout)
        ]
