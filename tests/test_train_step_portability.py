"""The training step away from its home ground: another model class, a capped GPU, other GPU generations.

1. The course's model. `CourseLM` below stands in for `cs336_basics.model.BasicsTransformerLM`: its own
   classes with the course's parameter names and shapes, the course's config dict and `context_length`, a
   RoPE module shared by every block, and attention computed by a module-level function with a boolean mask
   tensor (nothing pluggable). `build_train_step` takes it by structure; its first iteration's loss and
   every gradient equal the model's own forward + `F.cross_entropy`, fp32 on CPU (rtol 1e-5, atol 1e-6 as in
   test_train_step.py: the same function summed in other orders), whichever blocks recompute; one FusedAdamW
   step equals torch.optim.AdamW's from the same gradients. State dicts move between it and our
   `TransformerLM` unchanged. The `real_course` tests repeat the step check (every recompute mode) and the
   state-dict moves on the real `BasicsTransformerLM` where `import cs336_basics` works, and are skipped with
   the reason elsewhere.
2. The memory plan's budget honours `torch.cuda.set_per_process_memory_fraction` (CUDA queries faked).
3. Every route the step's kernels would take on compute capability 8.0, 8.9, 10.0 and 12.0 is a Triton kernel
   (the Hopper-only Gluon/wgmma kernels are gated off), and on 9.0 the Gluon route is taken. Pure dispatch
   decisions on fake CUDA tensors (FakeTensorMode) with the device's properties faked; nothing launches.
4. On a Hopper GPU (`gpu` marker) the step runs with the attention dispatch forced onto those generations'
   routes: only Triton attention kernels launch, and the loss, gradients and update agree with an fp32
   reference as the step on the GPU's own Gluon routes does.
"""

import copy
import math
import types

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from cs336_systems.model import TransformerLM
from cs336_systems.training import StepConfig, build_train_step, memory_plan
from cs336_systems.training.memory_plan import recompute_cost

VOCAB, D_MODEL, HEADS, D_FF, LAYERS, CONTEXT, BATCH = 97, 32, 2, 64, 3, 16, 2
RTOL, ATOL = 1e-5, 1e-6


# --- a course-like model (stands in for cs336_basics.model.BasicsTransformerLM) ---------------------------


class CourseLinear(nn.Module):
    def __init__(self, d_in, d_out):
        super().__init__()
        std = math.sqrt(2 / (d_in + d_out))
        self.weight = nn.Parameter(nn.init.trunc_normal_(torch.empty(d_out, d_in), std=std, a=-3 * std, b=3 * std))

    def forward(self, x):
        return torch.einsum("...i,oi->...o", x, self.weight)


class CourseEmbedding(nn.Module):
    def __init__(self, vocab_size, d_model):
        super().__init__()
        self.weight = nn.Parameter(nn.init.trunc_normal_(torch.empty(vocab_size, d_model), std=1.0, a=-3, b=3))

    def forward(self, token_ids):
        return self.weight[token_ids, :]


class CourseRMSNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x):
        in_dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * x).to(in_dtype)


class CourseRotaryEmbedding(nn.Module):
    """Rotates the pairs (x_{2k}, x_{2k+1}); its cache is a non-persistent buffer, so not in the state dict."""

    def __init__(self, context_length, dim, theta=10000.0):
        super().__init__()
        freqs = theta ** -(torch.arange(0, dim, 2) / dim)
        angles = torch.outer(torch.arange(context_length).float(), freqs)
        self.register_buffer("_freq_cis_cache", torch.stack((angles.cos(), angles.sin())), persistent=False)

    def forward(self, x, pos_ids):
        x1, x2 = x[..., 0::2], x[..., 1::2]
        cos, sin = self._freq_cis_cache[:, pos_ids]
        return torch.stack((cos * x1 - sin * x2, sin * x1 + cos * x2), dim=-1).flatten(-2)


def scaled_dot_product_attention(Q, K, V, mask=None):
    """The course's attention: a module-level function taking a boolean mask (True: attend)."""
    scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ V


class CourseAttention(nn.Module):
    def __init__(self, d_model, num_heads, positional_encoder):
        super().__init__()
        self.num_heads = num_heads
        self.q_proj, self.k_proj, self.v_proj, self.output_proj = (CourseLinear(d_model, d_model) for _ in range(4))
        self.positional_encoder = positional_encoder

    def forward(self, x, token_positions=None):
        b, s, d = x.shape

        def heads(t):
            return t.view(b, s, self.num_heads, -1).transpose(1, 2)

        positions = torch.arange(s, device=x.device) if token_positions is None else token_positions
        q = self.positional_encoder(heads(self.q_proj(x)), positions)
        k = self.positional_encoder(heads(self.k_proj(x)), positions)
        seq = torch.arange(s, device=x.device)
        causal_mask = seq[:, None] >= seq[None, :]
        out = scaled_dot_product_attention(Q=q, K=k, V=heads(self.v_proj(x)), mask=causal_mask)
        return self.output_proj(out.transpose(1, 2).reshape(b, s, d))


class CourseSwiGLU(nn.Module):
    def __init__(self, d_model, d_ff):
        super().__init__()
        self.w1, self.w2, self.w3 = (
            CourseLinear(d_model, d_ff),
            CourseLinear(d_ff, d_model),
            CourseLinear(d_model, d_ff),
        )

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class CourseBlock(nn.Module):
    def __init__(self, d_model, num_heads, d_ff, positional_encoder):
        super().__init__()
        self.attn = CourseAttention(d_model, num_heads, positional_encoder)
        self.ffn = CourseSwiGLU(d_model, d_ff)
        self.ln1, self.ln2 = CourseRMSNorm(d_model), CourseRMSNorm(d_model)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.ffn(self.ln2(x))


class CourseLM(nn.Module):
    def __init__(self, vocab_size, context_length, d_model, num_layers, num_heads, d_ff, rope_theta=10000.0):
        self.config = {k: v for k, v in locals().items() if k not in ("self", "__class__")}
        super().__init__()
        self.context_length = context_length
        self.token_embeddings = CourseEmbedding(vocab_size, d_model)
        self.positional_encoder = CourseRotaryEmbedding(context_length, d_model // num_heads, rope_theta)
        self.layers = nn.ModuleList(
            CourseBlock(d_model, num_heads, d_ff, self.positional_encoder) for _ in range(num_layers)
        )
        self.ln_final = CourseRMSNorm(d_model)
        self.lm_head = CourseLinear(d_model, vocab_size)

    def forward(self, x):
        x = self.token_embeddings(x)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.ln_final(x))


def make_course_model(seed=0):
    torch.manual_seed(seed)
    return CourseLM(VOCAB, CONTEXT, D_MODEL, LAYERS, HEADS, D_FF)


def batch(seed=1):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randint(0, VOCAB, (BATCH, CONTEXT), generator=g) for _ in range(2))


def one_block_kept_budget(step, x, monkeypatch):
    """A budget under which the last block keeps its activations and the others recompute (as
    test_train_step.mixed_budget: the measured block made 1 MB so that activations outweigh gradients)."""
    monkeypatch.setattr(memory_plan, "measure_block_memory", lambda block, h: (1 << 20, 0))
    return recompute_cost(LAYERS, 1, step.memory_terms(x, False))


def check_step_matches_plain(model, monkeypatch, recompute):
    """The step's first forward_backward on `model` against `model`'s own forward + F.cross_entropy on a copy;
    then one FusedAdamW step against torch.optim.AdamW from the same gradients."""
    plain = copy.deepcopy(model)
    x, y = batch()
    hyper = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    step = build_train_step(model, StepConfig(**hyper, recompute="plan" if recompute == "mixed" else recompute))
    if recompute == "mixed":
        step.config.memory_budget_bytes = one_block_kept_budget(step, x, monkeypatch)
    loss = step.forward_backward(x, y)
    expected = {"all": (True,) * LAYERS, "none": (False,) * LAYERS, "mixed": (True, True, False)}[recompute]
    plan = step.plans[(BATCH, CONTEXT)]
    assert plan.recompute == expected and not plan.keep_attention and not step.keepers

    logits = plain(x)
    ref = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    ref.backward()
    torch.testing.assert_close(loss, ref.detach(), rtol=RTOL, atol=ATOL)
    for (name, p), (_, q) in zip(model.named_parameters(), plain.named_parameters()):
        assert p.grad is not None, name
        torch.testing.assert_close(p.grad, q.grad, rtol=RTOL, atol=ATOL, msg=lambda m: f"{name}: {m}")

    reference = torch.optim.AdamW(plain.parameters(), **hyper)
    for p, q in zip(model.parameters(), plain.parameters()):
        q.grad = p.grad.clone()
    step.optimizer_step()
    reference.step()
    for (name, p), (_, q) in zip(model.named_parameters(), plain.named_parameters()):
        torch.testing.assert_close(p, q, rtol=2.4e-7, atol=1e-7, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("recompute", ["all", "none", "mixed"])
def test_course_model_step_matches_its_plain_forward(monkeypatch, recompute):
    check_step_matches_plain(make_course_model(), monkeypatch, recompute)


def test_course_model_is_run_by_structure_in_its_own_order():
    """The course's model has no `final_hidden_states`: the step walks it by structure (one function,
    `model_structure.final_hidden_states`), in its forward's order, each module once, the head only as the
    fused loss's weight; the hidden states are those its own forward multiplies by the head."""
    from cs336_systems.training.model_structure import final_hidden_states

    model = make_course_model()
    assert not hasattr(model, "final_hidden_states")
    step = build_train_step(model, StepConfig(recompute="none"))
    order = []
    for name in ("token_embeddings", *(f"layers.{i}" for i in range(LAYERS)), "ln_final", "lm_head"):
        model.get_submodule(name).register_forward_hook(lambda *_, name=name: order.append(name))
    x, y = batch()
    step.forward_backward(x, y)
    assert order == ["token_embeddings", *(f"layers.{i}" for i in range(LAYERS)), "ln_final"]
    with torch.no_grad():
        assert torch.equal(model.lm_head(final_hidden_states(model, x)), model(x))


def test_course_model_keeps_its_own_attention():
    """The step applies no attention swap to a block whose attention is its own code: no block gains an
    `attention` attribute, none keeps attention outputs, and the module-level function stays the one called."""
    model = make_course_model()
    step = build_train_step(model, StepConfig(recompute="all", keep_attention=True))
    x, y = batch()
    step.forward_backward(x, y)
    assert not step.attention_keepable() and not step.plans[(BATCH, CONTEXT)].keep_attention
    assert all(not hasattr(block.attn, "attention") for block in model.layers)
    assert step.parts.context_length == CONTEXT and step.parts.num_heads == HEADS
    with pytest.raises(ValueError, match="exceeds the model's context_length 16"):
        step.forward_backward(*(torch.zeros(1, CONTEXT + 1, dtype=torch.int64),) * 2)


def real_course_model(seed=0):
    """The course's own `cs336_basics.model.BasicsTransformerLM` at the test's size, where it imports."""
    basics = pytest.importorskip(
        "cs336_basics.model",
        reason="cs336_basics is not installed in this environment (put a course checkout's cs336-basics folder on "
        "PYTHONPATH, with einops, einx and jaxtyping installed, to run it)",
    )
    torch.manual_seed(seed)
    return basics.BasicsTransformerLM(
        vocab_size=VOCAB,
        context_length=CONTEXT,
        d_model=D_MODEL,
        num_layers=LAYERS,
        num_heads=HEADS,
        d_ff=D_FF,
        rope_theta=10000.0,
    )


COURSE_MODELS = {"course_like": make_course_model, "real_course": real_course_model}


@pytest.mark.parametrize("course_model", COURSE_MODELS)
@pytest.mark.parametrize("direction", ["course_to_ours", "ours_to_course"])
def test_state_dict_moves_between_course_model_and_ours(course_model, direction):
    """Same keys, shapes and function: a state dict loads strictly either way and the logits agree."""
    course = COURSE_MODELS[course_model](seed=0)
    torch.manual_seed(5)
    ours = TransformerLM(VOCAB, CONTEXT, D_MODEL, LAYERS, HEADS, D_FF)
    source, target = (course, ours) if direction == "course_to_ours" else (ours, course)
    state = source.state_dict()
    assert {k: v.shape for k, v in state.items()} == {k: v.shape for k, v in target.state_dict().items()}
    target.load_state_dict(state, strict=True)
    for k, v in target.state_dict().items():
        assert torch.equal(v, state[k]), k
    x, _ = batch()
    torch.testing.assert_close(target(x), source(x), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("recompute", ["all", "none", "mixed"])
def test_real_course_model_step_matches_its_plain_forward(monkeypatch, recompute):
    check_step_matches_plain(real_course_model(), monkeypatch, recompute)


class BiasedHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.token_embeddings = nn.Embedding(VOCAB, D_MODEL)
        self.layers = nn.ModuleList()
        self.ln_final = nn.Identity()
        self.lm_head = nn.Linear(D_MODEL, VOCAB)


class ScaledHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(VOCAB, D_MODEL))

    def forward(self, h):
        return h @ self.weight.T / math.sqrt(D_MODEL)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: nn.Linear(4, 4), "has no module `token_embeddings`"),
        (BiasedHead, "parameters besides its weight"),
        (
            lambda: setattr(m := make_course_model(), "lm_head", ScaledHead()) or m,
            r"does not compute h @ lm_head.weight\^T",
        ),
    ],
)
def test_model_without_the_structure_is_refused_naming_what_is_missing(make, match):
    with pytest.raises(TypeError, match=match):
        build_train_step(make())


# --- the budget under a per-process memory cap --------------------------------------------------------------

GIB = 1 << 30


def fake_card(monkeypatch, total_gib, free_gib, reserved_gib, fraction):
    """CUDA's memory queries faked: a card of `total_gib` with `free_gib` free, `reserved_gib` reserved by this
    process's allocator, and a per-process fraction (None: a torch without the getter)."""
    props = types.SimpleNamespace(total_memory=total_gib * GIB, major=9, minor=0, multi_processor_count=132)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free_gib * GIB, total_gib * GIB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: reserved_gib * GIB)
    if fraction is None:
        monkeypatch.delattr(torch.cuda, "get_per_process_memory_fraction", raising=False)
    else:

        def get_fraction(device=None):  # as torch's: an indexed device or an index, never a bare "cuda"
            if isinstance(device, torch.device) and device.index is None:
                raise ValueError(f"Expected a torch.device with a specified index or an integer, but got:{device}")
            return fraction

        monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", get_fraction)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)


@pytest.mark.parametrize(
    "total, free, reserved, fraction, expected_gib",
    [
        (141, 139, 0, 1.0, 139 - 5),  # uncapped: what is free, less the margin
        (141, 139, 0, 80 / 141, 80 - 5),  # an 80 GB card simulated on an H200: the cap, not the free memory
        (141, 100, 20, 80 / 141, 80 - 5),  # the cap bounds what is reserved too
        (141, 30, 20, 80 / 141, 50 - 5),  # another process holds memory: free + reserved is the smaller
        (80, 79, 0, None, 79 - 5),  # no getter in this torch: uncapped
    ],
    ids=["uncapped", "capped", "capped_with_reserved", "free_below_cap", "no_getter"],
)
def test_default_budget_is_the_smaller_of_free_memory_and_the_cap(
    monkeypatch, total, free, reserved, fraction, expected_gib
):
    fake_card(monkeypatch, total, free, reserved, fraction)
    cap = total * GIB * (1.0 if fraction is None else fraction)
    # an indexed device, and the bare "cuda" a notebook's context holds (the current device)
    for device in (torch.device("cuda", 0), torch.device("cuda")):
        assert memory_plan.default_budget_bytes(device) == pytest.approx(expected_gib * GIB, abs=1)
        assert memory_plan.process_memory_cap_bytes(device) == int(cap)


def test_torch_has_the_memory_fraction_getter():
    """The cap is read from torch; a torch without the getter would plan uncapped (`process_memory_cap_bytes`)."""
    assert callable(getattr(torch.cuda, "get_per_process_memory_fraction", None))


# --- routes on other GPU generations -------------------------------------------------------------------------

# The leaderboard's attention at its 8B shape (batch 1, 32 heads of 128, context 32,768, bf16, causal) and at a
# shorter context and d = 64, where the Gluon kernels' own limits differ. Batch 1: there the model's strided
# V (a transposed (B, N, H, d) view) merges into rows that a descriptor reads in place.
ATTENTION_SHAPES = [(1, 32, 32768, 128), (1, 16, 4096, 128), (1, 32, 16384, 64)]
GENERATIONS = {(8, 0): 108, (8, 9): 128, (9, 0): 132, (10, 0): 148, (12, 0): 84}  # capability -> SMs


@pytest.fixture
def fake_capability(monkeypatch):
    """Returns set(major, minor): CUDA device 0 reads as that capability to torch and to the attention
    dispatch (`flash_configs.device_facts`, cached per device index, cleared here)."""
    from cs336_systems.attention import configs as flash_configs

    def set_capability(major, minor):
        props = types.SimpleNamespace(
            major=major,
            minor=minor,
            multi_processor_count=GENERATIONS[(major, minor)],
            total_memory=80 * GIB,
            name=f"fake sm_{major}{minor}",
        )
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (major, minor))
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(flash_configs, "_DEVICE_FACTS", {})

    return set_capability


def fake_qkv(shape):
    """q (contiguous, as RoPE leaves it) and k, v as the model's head split leaves v: (B, N, H, d) transposed."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    b, h, n, d = shape
    with FakeTensorMode():
        q = torch.empty(shape, dtype=torch.bfloat16, device="cuda")
        k = torch.empty(shape, dtype=torch.bfloat16, device="cuda")
        v = torch.empty(b, n, h, d, dtype=torch.bfloat16, device="cuda").transpose(1, 2)
    return q, k, v


def attention_routes(shape):
    """(forward Gluon?, backward Gluon?, Triton reads by tensor descriptor?) as the dispatch decides them on
    the faked device (not interpreted: the decision a GPU would make)."""
    from cs336_systems.attention.launch import dispatch
    from cs336_systems.attention.launch import layout as flash_layout

    q, k, v = fake_qkv(shape)
    forward, backward = dispatch.gluon_kernels(q, k, v, True, interpreted=False)
    return forward, backward, flash_layout.tma_device(q)


@pytest.mark.parametrize("capability", [(8, 0), (8, 9), (10, 0), (12, 0)], ids=lambda c: f"sm{c[0]}{c[1]}")
@pytest.mark.parametrize("shape", ATTENTION_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_attention_takes_triton_routes_off_hopper(fake_capability, monkeypatch, capability, shape):
    """Off Hopper neither direction takes a Gluon (wgmma) kernel; the Triton kernels read through tensor
    descriptors (TMA) only from capability 9 on, where the hardware has them, else through block pointers."""
    from cs336_systems.attention.launch import layout as flash_layout

    monkeypatch.setattr(flash_layout, "INTERPRETED", False)
    fake_capability(*capability)
    forward, backward, descriptors = attention_routes(shape)
    assert not forward and not backward
    assert descriptors == (capability[0] >= 9)


@pytest.mark.parametrize("shape", ATTENTION_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_attention_takes_the_gluon_route_on_hopper(fake_capability, monkeypatch, shape):
    from cs336_systems.attention.launch import layout as flash_layout

    monkeypatch.setattr(flash_layout, "INTERPRETED", False)
    fake_capability(9, 0)
    forward, backward, descriptors = attention_routes(shape)
    assert forward and backward and descriptors


def test_fused_loss_and_adamw_kernels_use_nothing_generation_specific(fake_capability):
    """The fused loss (torch matmuls and one Triton row kernel) and FusedAdamW (Triton elementwise kernels) have no
    capability gate: their Triton sources use no Gluon, wgmma, tensor descriptor or inline PTX, and their launch
    choices read no capability (FusedAdamW's block is the same on every GPU)."""
    import inspect

    from cs336_systems.fused_loss import cross_entropy_kernels, linear_cross_entropy
    from cs336_systems.optim import fused_adamw_kernels

    for module in (cross_entropy_kernels, linear_cross_entropy, fused_adamw_kernels):
        source = inspect.getsource(module)
        for feature in ("gluon", "wgmma", "warpgroup", "make_tensor_descriptor", "inline_asm", "capability"):
            assert feature not in source, f"{module.__name__} uses {feature}"
    blocks = set()
    for capability in GENERATIONS:
        fake_capability(*capability)
        blocks.add(fused_adamw_kernels.block_size(torch.device("cuda", 0), 1 << 20))
    assert len(blocks) == 1, f"FusedAdamW's block depends on the GPU: {blocks}"


# --- the step on a Hopper GPU forced onto other generations' routes -------------------------------------------

# d_head 128 at context 4,096 with 4 heads: where a Hopper takes the Gluon forward (batch·heads >= 4) and the
# fused Gluon backward (32 key tiles · 4 >= 0.75 CTAs per SM on 132 SMs), so forcing another capability
# changes both directions' kernels.
FORCED_VOCAB, FORCED_CONTEXT, FORCED_D_MODEL, FORCED_HEADS, FORCED_D_FF, FORCED_LAYERS = 1000, 4096, 512, 4, 1024, 2
GLUON_KERNELS = ("flash_fwd_gluon_kernel", "flash_bwd_gluon")
TRITON_KERNELS = ("flash_fwd_kernel", "flash_bwd_dq_kernel", "flash_bwd_dkdv_kernel")


def hopper_gpu() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


def step_on_routes(model, x, y, capability):
    """One step (forward, backward, FusedAdamW) of a copy of `model` with the attention dispatch reading the
    device as `capability` (None: as it is). Returns (loss, gradients before the update, parameters after it,
    names of the CUDA kernels launched). Every cache derived from the device's facts is cleared before and
    after, so routes decided here do not leak into other tests."""
    from cs336_systems.attention import configs as flash_configs

    model = copy.deepcopy(model)
    index = torch.cuda.current_device()
    flash_configs.forget_answers()
    try:
        with pytest.MonkeyPatch.context() as patch:
            if capability is not None:
                sms = flash_configs.device_facts(torch.device("cuda", index))[1]
                patch.setitem(flash_configs._DEVICE_FACTS, index, (capability[0], sms))
            step = build_train_step(model, StepConfig(recompute="all"))
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
                loss = step.forward_backward(x, y)
                grads = [p.grad.detach().clone() for p in model.parameters()]
                step.optimizer_step()
                torch.cuda.synchronize()
    finally:
        flash_configs.forget_answers()
    kernels = {event.key for event in profile.key_averages()}
    return loss, grads, [p.detach().clone() for p in model.parameters()], kernels


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.gpu
@pytest.mark.skipif(not hopper_gpu(), reason="needs a Hopper GPU (compute capability 9), whose own routes are Gluon's")
@pytest.mark.parametrize("capability", [(8, 0), (10, 0), (12, 0)], ids=lambda c: f"sm{c[0]}{c[1]}")
def test_gpu_step_runs_other_generations_routes_on_a_hopper(capability):
    """A Hopper GPU whose attention dispatch reads it as Ampere, Blackwell or consumer Blackwell runs the whole
    step (the kept-output attention forward and its recompute, the Triton backward kernels, the fused loss,
    FusedAdamW) on the Triton kernels only, and computes what the Gluon routes compute.

    bf16 model, every block recomputed. References: the same weights in fp32 with the plain attention and
    `F.cross_entropy` for the loss and gradients (relative errors: loss 1e-3, each gradient's norm 3e-2; bf16
    keeps 8 significant bits, 3.9e-3 per rounding, and the gradients pass a few dozen roundings); the same step
    on the device's own (Gluon) routes, which must launch the Gluon kernels (else the comparison shows
    nothing) and meet the same bounds. The update: torch.optim.AdamW in fp32 on fp32 copies of the same
    parameters and gradients; FusedAdamW rounds each bf16 parameter stochastically from its fp32 result, so
    it lies within one bf16 ulp (2^-7 relative) of it."""
    from cs336_systems.attention.naive import naive_attention

    torch.manual_seed(0)
    model = TransformerLM(
        FORCED_VOCAB,
        FORCED_CONTEXT,
        FORCED_D_MODEL,
        FORCED_LAYERS,
        FORCED_HEADS,
        FORCED_D_FF,
        attention="flash_triton",
        device="cuda",
        dtype=torch.bfloat16,
    )
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randint(0, FORCED_VOCAB, (1, FORCED_CONTEXT), device="cuda", generator=g)
    y = torch.randint(0, FORCED_VOCAB, (1, FORCED_CONTEXT), device="cuda", generator=g)

    plain = copy.deepcopy(model).float()
    for block in plain.layers:
        block.attn.attention = naive_attention
    ref_loss = F.cross_entropy(plain(x).reshape(-1, FORCED_VOCAB), y.reshape(-1))
    ref_loss.backward()
    ref_grads = [p.grad for p in plain.parameters()]
    names = [name for name, _ in model.named_parameters()]

    forced = step_on_routes(model, x, y, capability)
    own = step_on_routes(model, x, y, None)
    assert not any(k for k in forced[3] if any(gluon in k for gluon in GLUON_KERNELS)), sorted(forced[3])
    for triton_kernel in TRITON_KERNELS:
        assert any(triton_kernel in k for k in forced[3]), f"{triton_kernel} did not run: {sorted(forced[3])}"
    assert all(any(gluon in k for k in own[3]) for gluon in GLUON_KERNELS), sorted(own[3])

    for route, (loss, grads, _, _) in (("forced", forced), ("own", own)):
        assert relative_error(loss, ref_loss.detach()) <= 1e-3, f"{route} route loss {loss} vs {ref_loss}"
        for name, grad, ref in zip(names, grads, ref_grads):
            err = relative_error(grad, ref)
            assert err <= 3e-2, f"{route} route, {name}: gradient relative error {err:.3g}"

    _, grads, params, _ = forced
    start = [p.detach().float().clone().requires_grad_() for p in model.parameters()]
    for p, grad in zip(start, grads):
        p.grad = grad.float()
    config = StepConfig()
    torch.optim.AdamW(start, lr=config.lr, betas=config.betas, eps=config.eps, weight_decay=config.weight_decay).step()
    for name, ours, exact in zip(names, params, start):
        exact = exact.detach()
        excess = (ours.float() - exact).abs() - exact.abs() * 2**-7
        assert excess.max().item() <= 1e-12, f"{name}: updated parameter more than one bf16 ulp from fp32 AdamW's"
