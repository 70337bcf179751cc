import pytest
import torch

from cs336_systems.attention.naive import softmax
from cs336_systems.model import (
    MODEL_SIZES,
    SIZE_TABLES,
    Embedding,
    Linear,
    ModelConfig,
    RMSNorm,
    RotaryEmbedding,
    TransformerLM,
    count_parameters,
    cross_entropy,
    handout_name,
)

EXPECTED_PARAMETERS = {
    "small": 128_625_408,
    "medium": 423_183_360,
    "large": 969_411_840,
    "xl": 1_998_235_200,
    "2.7B": 3_406_809_600,
}


@pytest.mark.parametrize("size", EXPECTED_PARAMETERS)
def test_parameter_counts_match_the_handout(size):
    model = TransformerLM.from_size(size, context_length=256, device="meta")
    assert count_parameters(model) == EXPECTED_PARAMETERS[size]


def tiny_model(**kwargs):
    torch.manual_seed(0)
    return TransformerLM(vocab_size=50, context_length=16, d_model=32, num_layers=2, num_heads=4, d_ff=64, **kwargs)


def test_forward_backward_of_a_tiny_model():
    model = tiny_model()
    x = torch.randint(0, 50, (3, 16))
    logits = model(x)
    assert logits.shape == (3, 16, 50)
    loss = cross_entropy(logits[:, :-1], x[:, 1:])
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    # an untrained model predicts close to uniformly
    assert abs(loss.item() - torch.log(torch.tensor(50.0)).item()) < 1.0


def test_changing_a_later_token_does_not_change_earlier_logits():
    model = tiny_model()
    x = torch.randint(0, 50, (2, 16))
    y = x.clone()
    y[:, 10] = (y[:, 10] + 1) % 50
    with torch.no_grad():
        a, b = model(x), model(y)
    torch.testing.assert_close(a[:, :10], b[:, :10])
    assert not torch.allclose(a[:, 10:], b[:, 10:])


@pytest.mark.parametrize("attention", ["sdpa"])
def test_attention_implementations_agree_with_naive(attention):
    x = torch.randint(0, 50, (2, 16))
    naive, other = tiny_model(), tiny_model(attention=attention)
    with torch.no_grad():
        torch.testing.assert_close(other(x), naive(x), rtol=1e-4, atol=1e-4)


def test_checkpointing_gives_the_same_gradients():
    x = torch.randint(0, 50, (2, 16))
    grads = []
    for every in (None, 1, 2):
        model = tiny_model(checkpoint_every=every)
        cross_entropy(model(x)[:, :-1], x[:, 1:]).backward()
        grads.append([p.grad for p in model.parameters()])
    for g in grads[1:]:
        for a, b in zip(grads[0], g):
            torch.testing.assert_close(a, b)


def test_final_hidden_states_are_what_the_head_multiplies():
    """`final_hidden_states` is the forward up to the final norm: the LM head of it is the forward's logits bit
    for bit, and a `run_block` runs each block in its place, in order, with the block's own input."""
    model = tiny_model()
    x = torch.randint(0, 50, (2, 16))
    calls = []

    def run_block(i, block, h):
        calls.append((i, block))
        return block(h)

    with torch.no_grad():
        logits = model(x)
        assert torch.equal(model.lm_head(model.final_hidden_states(x)), logits)
        assert torch.equal(model.lm_head(model.final_hidden_states(x, run_block=run_block)), logits)
    assert calls == list(enumerate(model.layers))


def test_components_against_references():
    lin = Linear(8, 4)
    assert lin.weight.shape == (4, 8)
    x = torch.randn(3, 8)
    torch.testing.assert_close(lin(x), torch.nn.functional.linear(x, lin.weight))
    emb = Embedding(10, 4)
    torch.testing.assert_close(emb(torch.tensor([3, 1])), emb.weight[[3, 1]])
    norm = RMSNorm(8)
    xb = torch.randn(2, 8, dtype=torch.bfloat16)
    out = norm(xb)
    assert out.dtype == torch.bfloat16
    ref = torch.nn.functional.rms_norm(xb.float(), (8,), eps=1e-5)
    torch.testing.assert_close(out.float(), ref, rtol=1e-2, atol=1e-2)
    s = torch.randn(4, 7) * 30
    torch.testing.assert_close(softmax(s), torch.softmax(s, dim=-1))
    logits, targets = torch.randn(5, 11), torch.randint(0, 11, (5,))
    torch.testing.assert_close(cross_entropy(logits, targets), torch.nn.functional.cross_entropy(logits, targets))


def test_rope_rotates_pairs_and_preserves_norm():
    rope = RotaryEmbedding(8, context_length=16)
    x = torch.randn(2, 16, 8)
    pos = torch.arange(16)
    y = rope(x, pos)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))
    torch.testing.assert_close(y[:, 0], x[:, 0])  # position 0 is not rotated
    # relative property: <R_m q, R_n k> depends only on m - n
    q, k = torch.randn(8), torch.randn(8)

    def dot(m, n):
        return (rope(q.expand(16, 8), pos)[m] * rope(k.expand(16, 8), pos)[n]).sum()

    torch.testing.assert_close(dot(5, 3), dot(9, 7), rtol=1e-4, atol=1e-4)


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="unknown model size 'huge'"):
        ModelConfig.from_size("huge")
    model = tiny_model()
    with pytest.raises(ValueError, match="exceeds the model's context_length 16"):
        model(torch.zeros(1, 17, dtype=torch.long))
    with pytest.raises(ValueError, match="unknown attention"):
        tiny_model(attention="magic")
    with pytest.raises(ValueError, match="not divisible by num_heads"):
        TransformerLM(50, 16, 30, 1, 4, 64)


def test_model_sizes_table_has_the_handout_sizes():
    assert {"small", "medium", "large", "xl", "2.7B"} <= set(MODEL_SIZES)
    assert MODEL_SIZES["xl"] == dict(d_model=1600, d_ff=6400, num_layers=48, num_heads=25)


def test_both_handouts_size_tables():
    """The 2026 xl is the 2025 2.7B's shape under a new name; 10B is new; "xl" keeps its 2025 meaning."""
    assert all(key in MODEL_SIZES for table in SIZE_TABLES.values() for key in table.values())
    assert MODEL_SIZES[SIZE_TABLES["2026"]["xl"]] == MODEL_SIZES["2.7B"] != MODEL_SIZES["xl"]
    assert MODEL_SIZES["10B"] == dict(d_model=4608, d_ff=12288, num_layers=50, num_heads=36)
    assert handout_name("2.7B", "2026") == "xl" and handout_name("xl-2026", "2025") == "2.7B"
    assert handout_name("xl", "2026") is None and handout_name("10B", "2025") is None
    with torch.device("meta"):
        small = count_parameters(TransformerLM.from_config(ModelConfig.from_size("small")))
        ten_b = count_parameters(TransformerLM.from_config(ModelConfig.from_size("10B")))
    assert small == 128_625_408
    # 2 V d + L (4 d^2 + 3 d F + 2 d) + d at V = 10,000: about 12.8 billion.
    assert ten_b == 2 * 10_000 * 4608 + 50 * (4 * 4608**2 + 3 * 4608 * 12288 + 2 * 4608) + 4608 == 12_832_823_808


@pytest.mark.parametrize(
    "ids, match",
    [
        (torch.tensor([[1, -1]]), r"token ids must be in \[0, 50\), got ids in \[-1, 1\]"),
        (torch.tensor([[1, 50]], dtype=torch.int32), r"token ids must be in \[0, 50\), got ids in \[1, 50\]"),
        (torch.tensor([[1.0, 2.0]]), "int64 or int32 token ids, got torch.float32"),
        (torch.tensor([[True, False]]), "int64 or int32 token ids, got torch.bool"),
    ],
    ids=["negative", "vocab-size", "float", "bool"],
)
def test_token_ids_outside_the_vocabulary_raise(ids, match):
    """Indexing the embedding would take id -1 as the last row (and a bool tensor as a mask)."""
    with pytest.raises(ValueError, match=match):
        tiny_model()(ids)


def test_token_id_check_compiles_without_a_graph_break():
    """The range check reads values back, so it stays out of a torch.compile graph (fullgraph fails on a break)."""
    model = tiny_model()
    x = torch.randint(0, 50, (2, 8))
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(x), model(x))
