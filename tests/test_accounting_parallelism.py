"""The parallelism accounting against hand-computed numbers, brute force, autograd and a FLOP counter."""

import math

import pytest
import sympy as sp
import torch

from cs336_systems.accounting import ffn_stack, mesh, parallelism, rings, sharded_ffn
from cs336_systems.accounting.ffn_stack import GB, TPU_V5P, XXL, GiB
from cs336_systems.accounting.parallelism import D_FF, B, C, D, W

S, N = sp.symbols("S N", positive=True)


# --- XXL memory (spring 2025 §2.4 a, b)


def test_xxl_parameter_count():
    assert XXL.num_parameters == 219_848_638_464 == 2 * 16384 * 53248 * 126


def test_xxl_training_state_in_gb_and_gib():
    parts = ffn_stack.training_state_bytes(XXL)
    total = sum(parts.values())
    assert len(parts) == 4 and all(b == 219_848_638_464 * 4 for b in parts.values())
    assert total == 3_517_578_215_424
    assert round(total / GB, 2) == 3517.58
    assert total / GiB == pytest.approx(3276.0)
    table = ffn_stack.training_state_table(XXL)
    assert table.set_index("component").loc["total", "GB"] == pytest.approx(3517.578215424)


def test_saved_activations_are_the_inputs_of_both_linears_in_bf16():
    assert ffn_stack.stack_saved_activation_bytes(XXL, 1) == 126 * (16384 + 53248) * 2 == 17_547_264
    assert ffn_stack.stack_saved_activation_bytes(XXL, 3, tp_degree=4) == 3 * 126 * (16384 + 53248 / 4) * 2


def test_fsdp_devices_to_fit_a_v5p():
    state = sum(ffn_stack.training_state_bytes(XXL).values())
    n = ffn_stack.fsdp_devices_to_fit(state, 0, TPU_V5P.memory_bytes)
    assert n == pytest.approx(3_517_578_215_424 / 95e9)
    assert math.ceil(n) == 38
    assert ffn_stack.fsdp_memory_per_device(state, 0, 38) < 95 * GB < ffn_stack.fsdp_memory_per_device(state, 0, 37)
    activations = ffn_stack.stack_saved_activation_bytes(XXL, 4096)
    n = ffn_stack.fsdp_devices_to_fit(state, activations, 95 * GB)
    assert ffn_stack.fsdp_memory_per_device(state, activations, n) == pytest.approx(95 * GB)
    with pytest.raises(ValueError, match="no N_FSDP fits"):
        ffn_stack.fsdp_devices_to_fit(state, 2 * 95 * GB, 95 * GB)
    S_, A, M = sp.symbols("S A M", positive=True)
    symbolic = ffn_stack.fsdp_devices_to_fit(S_, A, M, sp.S.Half)
    assert sp.simplify(symbolic - (S_ + A / 2) / (M - A / 2)) == 0


def test_memory_per_device_by_strategy():
    state = 3_517_578_215_424
    per_token = 17_547_264
    assert ffn_stack.stack_memory_per_device(XXL, 64, "DP", 8) == state + 8 * per_token
    assert ffn_stack.stack_memory_per_device(XXL, 64, "FSDP", 8) == state / 8 + 8 * per_token
    assert ffn_stack.stack_memory_per_device(XXL, 64, "TP", 8) == state / 8 + 64 * 126 * (16384 + 53248 / 8) * 2
    with pytest.raises(ValueError, match="unknown strategy"):
        ffn_stack.stack_memory_per_device(XXL, 64, "PP", 8)


# --- TPU mesh (spring 2025 §2.4 c, d)


def test_mesh_compute_bound_batch_for_the_handout_mesh():
    batch = mesh.mesh_min_batch(16384, 53248, 16, 4, 4.6e14, 2 * 9e10, 2, 1)
    assert batch == pytest.approx(16 * 4.6e14 / (2 * 1.8e11))  # X C / (M_X W_ici) = 20,444.4 tokens
    assert batch / 64 == pytest.approx(319.444, rel=1e-5)
    assert mesh.mesh_max_tp(53248, 4.6e14, 1.8e11, 1) == pytest.approx(53248 * 1.8e11 / 4.6e14)
    times = mesh.mesh_forward_times(batch, 16384, 53248, 16, 4, 4.6e14, 1.8e11, 2, 1)
    assert times["math"] == pytest.approx(times["fsdp"]) and times["tp"] < times["math"]


def test_mesh_symbolic_forms_and_best_split():
    X, Y, Cs, Wi, MX, MY, F, Ns = sp.symbols("X Y C W_ici M_X M_Y F N", positive=True)
    assert sp.simplify(mesh.mesh_min_batch(D, F, X, Y, Cs, Wi, MX, MY) - Cs * X / (MX * Wi)) == 0
    assert sp.simplify(mesh.mesh_max_tp(F, Cs, Wi, MY) - MY * F * Wi / Cs) == 0
    best = mesh.mesh_best_split(Ns, F, Cs, Wi, MX, MY)
    assert sp.simplify(best["batch"] - Ns * Cs**2 / (MX * MY * F * Wi**2)) == 0
    table = mesh.mesh_batch_table(
        16384,
        53248,
        4.6e14,
        1.8e11,
        [
            dict(name="fp8", x=16, y=4, m_x=2, m_y=1, bytes_per_value=1),
            dict(name="too much TP", x=1, y=64, m_x=1, m_y=1),
        ],
    ).set_index("layout")
    assert table.loc["fp8", "min_global_batch"] == pytest.approx(16 * 4.6e14 / (2 * 1.8e11) / 2)
    assert not table.loc["too much TP", "tp_compute_bound"] and table.loc["too much TP", "min_global_batch"] == math.inf


# --- ring collectives (spring 2026 §8.1)


def test_ring_closed_forms_symbolically():
    assert sp.simplify(rings.ring_all_gather_time(S, N, W) - (N - 1) * S / (N * W)) == 0
    assert sp.simplify(rings.ring_reduce_scatter_time(S, N, W) - (N - 1) * S / (N * W)) == 0
    assert sp.simplify(rings.ring_all_reduce_time(S, N, W) - 2 * (N - 1) * S / (N * W)) == 0
    assert sp.simplify(rings.alternate_ring_all_reduce_time(S, N, W) - (N - 1) * S / W) == 0
    with pytest.raises(ValueError, match="at least one device"):
        rings.ring_all_reduce_time(10, 0, 1.0)


@pytest.mark.parametrize("n", range(2, 9))
def test_simulated_rings_match_truth_and_closed_forms(n):
    gen = torch.Generator().manual_seed(n)
    numel = 840  # divisible by 2..8
    xs = [torch.randn(numel, generator=gen, dtype=torch.float64) for _ in range(n)]
    size, bandwidth = numel * 8, 3.0e9
    total = torch.stack(xs).sum(0)

    gathered = rings.simulate_ring_all_gather(xs)
    assert all(torch.equal(out, torch.cat(xs)) for out in gathered.outputs)
    assert gathered.bytes_sent == [[size] * n] * (n - 1)
    assert gathered.time(bandwidth) == pytest.approx(rings.ring_all_gather_time(n * size, n, bandwidth))

    scattered = rings.simulate_ring_reduce_scatter(xs)
    for out, want in zip(scattered.outputs, total.chunk(n)):
        torch.testing.assert_close(out, want)
    assert scattered.bytes_sent == [[size // n] * n] * (n - 1)
    assert scattered.time(bandwidth) == pytest.approx(rings.ring_reduce_scatter_time(size, n, bandwidth))

    for simulate, closed_form, step_bytes in [
        (rings.simulate_ring_all_reduce, rings.ring_all_reduce_time, size // n),
        (rings.simulate_alternate_ring_all_reduce, rings.alternate_ring_all_reduce_time, size),
    ]:
        run = simulate(xs)
        for out in run.outputs:
            torch.testing.assert_close(out, total)
        assert all(b == step_bytes for step in run.bytes_sent for b in step)
        assert run.time(bandwidth) == pytest.approx(closed_form(size, n, bandwidth))


def test_ring_simulation_table_agrees_and_bad_inputs_fail():
    table = rings.ring_simulation_table(list(range(2, 9)), 840, bandwidth=1e9)
    assert len(table) == 4 * 7
    assert (table.simulated_time_s - table.closed_form_time_s).abs().max() < 1e-15
    assert table.max_abs_error.max() < 1e-12
    with pytest.raises(ValueError, match="does not split"):
        rings.simulate_ring_reduce_scatter([torch.zeros(5)] * 2)
    with pytest.raises(ValueError, match="device 1 holds"):
        rings.simulate_ring_all_gather([torch.zeros(4), torch.zeros(3)])


# --- FLOPs (spring 2026 §8.2–8.5)


def test_ffn_flops_match_the_flop_counter_unsharded():
    b, d, f = 5, 7, 11
    forward, backward = sharded_ffn.counted_flops(
        torch.randn(b, d), torch.randn(d, f), torch.randn(d, f), torch.randn(f, d)
    )
    assert forward == parallelism.ffn_forward_flops(b, d, f) == 6 * b * d * f
    assert backward == parallelism.ffn_backward_flops(b, d, f) == 12 * b * d * f


@pytest.mark.parametrize("n", [2, 3, 4])
def test_per_device_flops_match_the_flop_counter(n):
    table = sharded_ffn.flop_check_table(batch=12, d_model=10, d_ff=24, n=n)
    assert set(table.strategy) == {"DP", "FSDP", "TP", "FSDP×TP"}
    assert (table.counted == table.formula).all()
    with pytest.raises(ValueError, match="must both split"):
        sharded_ffn.flop_check_table(batch=13, d_model=10, d_ff=24, n=n)


def test_tensor_parallel_passes_match_autograd():
    gen = torch.Generator().manual_seed(0)
    x, w1, w2, w3 = (
        torch.randn(*s, generator=gen, dtype=torch.float64, requires_grad=True)
        for s in [(6, 8), (8, 12), (8, 12), (12, 8)]
    )
    y = sharded_ffn.ffn(x, w1, w2, w3)
    dy = torch.randn(y.shape, generator=gen, dtype=torch.float64)
    y.backward(dy)
    with torch.no_grad():
        y_tp, saved = sharded_ffn.tensor_parallel_ffn_forward(x, w1, w2, w3, n_tp=3)
        dx, dw = sharded_ffn.tensor_parallel_ffn_backward(dy, x, saved)
    torch.testing.assert_close(y_tp, y.detach())
    torch.testing.assert_close(dx, x.grad)
    torch.testing.assert_close(torch.cat(dw["w1"], dim=1), w1.grad)
    torch.testing.assert_close(torch.cat(dw["w2"], dim=1), w2.grad)
    torch.testing.assert_close(torch.cat(dw["w3"], dim=0), w3.grad)
    with pytest.raises(ValueError, match="does not split"):
        sharded_ffn.tensor_parallel_ffn_forward(x, w1, w2, w3, n_tp=5)


def test_silu_derivative_matches_autograd():
    x = torch.linspace(-6, 6, 101, dtype=torch.float64, requires_grad=True)
    torch.nn.functional.silu(x).sum().backward()
    torch.testing.assert_close(sharded_ffn.silu_derivative(x.detach()), x.grad)


# --- communication and limits (spring 2026 §8.2–8.5)


def test_communication_times_symbolically():
    n = sp.Symbol("N", positive=True)
    assert sp.simplify(parallelism.dp_backward_comm_time(D, D_FF, n, W) - 12 * (n - 1) * D * D_FF / (n * W)) == 0
    assert sp.simplify(parallelism.fsdp_comm_time(D, D_FF, n, W) - 12 * (n - 1) * D * D_FF / (n * W)) == 0
    assert (
        sp.simplify(parallelism.fsdp_comm_time(D, D_FF, n, W, backward=False) - 6 * (n - 1) * D * D_FF / (n * W)) == 0
    )
    assert sp.simplify(parallelism.tp_comm_time(B, D, n, W) - 4 * (n - 1) * B * D / (n * W)) == 0
    f, t = sp.symbols("f t", positive=True)
    fsdp, tp = parallelism.fsdp_tp_forward_comm_times(B, D, D_FF, f, t, W)
    assert sp.simplify(fsdp - 6 * (f - 1) * D * D_FF / (f * t * W)) == 0
    assert sp.simplify(tp - 4 * (t - 1) * B * D / (t * f * W)) == 0


def test_device_limits_symbolically():
    assert sp.simplify(parallelism.dp_max_devices(B, D, D_FF, C, W) - (1 + B * W / C)) == 0
    for backward in (True, False):
        assert sp.simplify(parallelism.fsdp_max_devices(B, D, D_FF, C, W, backward) - (1 + B * W / C)) == 0
    assert sp.simplify(parallelism.tp_max_devices(B, D, D_FF, C, W) - (1 + 3 * D_FF * W / C)) == 0
    assert sp.simplify(parallelism.tp_max_devices(B, D, D_FF, C, W, backward=False) - (1 + 3 * D_FF * W / (2 * C))) == 0
    n_fsdp, n_tp, n = parallelism.fsdp_tp_max_devices_overlapped(B, D, D_FF, C, W)
    assert sp.simplify(n - (1 + B * W / C) * (1 + 3 * D_FF * W / (2 * C))) == 0
    _, _, n_shared = parallelism.fsdp_tp_max_devices_shared(B, D, D_FF, C, W)
    assert sp.simplify(n_shared - (3 * B * D_FF * W / C + 3 * D_FF + 2 * B) ** 2 / (24 * B * D_FF)) == 0


ARGS = dict(batch=60, d_model=8, d_ff=28, flops_per_s=1.0, bandwidth=1.1)  # small limits, no ties


def test_numeric_limits_sit_where_compute_equals_communication():
    a = ARGS
    n = parallelism.dp_max_devices(**a)
    assert n == pytest.approx(1 + 60 * 1.1)
    compute = parallelism.dp_flops(a["batch"], a["d_model"], a["d_ff"], n) / a["flops_per_s"]
    assert compute == pytest.approx(parallelism.dp_backward_comm_time(a["d_model"], a["d_ff"], n, a["bandwidth"]))
    n = parallelism.tp_max_devices(**a, backward=False)
    above = n + 1
    assert (
        parallelism.tp_comm_time(a["batch"], a["d_model"], above, a["bandwidth"])
        > parallelism.tp_flops(a["batch"], a["d_model"], a["d_ff"], above, backward=False) / a["flops_per_s"]
    )


def _compute_bound(f, t, shared):
    a = ARGS
    compute = parallelism.fsdp_tp_forward_flops(a["batch"], a["d_model"], a["d_ff"], f, t) / a["flops_per_s"]
    fsdp, tp = parallelism.fsdp_tp_forward_comm_times(a["batch"], a["d_model"], a["d_ff"], f, t, a["bandwidth"])
    return (fsdp + tp if shared else max(fsdp, tp)) <= compute * (1 + 1e-12)


@pytest.mark.parametrize("shared", [False, True])
def test_best_integer_split_matches_brute_force(shared):
    best = parallelism.best_fsdp_tp_split(**ARGS, overlapped=not shared)
    brute = max(f * t for f in range(1, 200) for t in range(1, 100) if _compute_bound(f, t, shared))
    assert best["n"] == best["n_fsdp"] * best["n_tp"] == brute
    assert _compute_bound(best["n_fsdp"], best["n_tp"], shared)
    limit = (parallelism.fsdp_tp_max_devices_shared if shared else parallelism.fsdp_tp_max_devices_overlapped)(**ARGS)[
        2
    ]
    assert brute <= limit


def test_shared_optimum_beats_nearby_real_splits():
    n_fsdp, n_tp, n = parallelism.fsdp_tp_max_devices_shared(**ARGS)
    assert n == pytest.approx(n_fsdp * n_tp)
    assert _compute_bound(n_fsdp * (1 - 1e-9), n_tp * (1 - 1e-9), shared=True)
    for scale in (0.9, 1.1):  # same N, other shapes: over budget
        assert not _compute_bound(n_fsdp * scale, n_tp / scale, shared=True)


def test_answer_table_covers_every_problem_with_formula_and_number():
    from cs336_systems.accounting.parallelism_answers import Example, answers_markdown, parallelism_answers

    ex = Example(
        batch=60, d_model=8, d_ff=28, n_devices=4, n_fsdp=4, n_tp=2, flops_per_s=1.0, bandwidth=1.1, ring_bytes=1000.0
    )
    answers = parallelism_answers(ex)
    assert set(answers.problem) == {
        "alternate_ring_all_reduce",
        "data_parallel_calcs",
        "fsdp_calcs",
        "tp_calcs",
        "fsdp_tp_calcs",
    }
    rows = answers.set_index(["problem", "part", "quantity"])
    assert rows.loc[("alternate_ring_all_reduce", "", "time"), "value"] == pytest.approx(3 * 1000 / 1.1)
    assert rows.loc[("data_parallel_calcs", "a", "backward FLOPs per device"), "value"] == 12 * 60 * 8 * 28 / 4
    dp_limit = rows.loc[("data_parallel_calcs", "c", "largest N before communication bound")]
    assert dp_limit.value == pytest.approx(1 + 60 * 1.1) and sp.simplify(dp_limit.formula - (1 + B * W / C)) == 0
    text = answers_markdown(answers, "tp_calcs")
    assert r"N_{TP} \le" in text and "(d)" in text
