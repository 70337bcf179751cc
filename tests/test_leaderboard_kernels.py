"""The leaderboard step kernel by kernel (experiments/leaderboard_kernels.py): names, phases, the summary.

The kernel names below are those torch.profiler reported on an H100 (torch 2.11) for ours and
SDPA-cuDNN, with their template arguments cut short."""

import pandas as pd
import pytest
import torch

from cs336_systems.experiments import leaderboard_kernels as lk

OURS = [
    "flash_fwd_gluon_kernel",
    "Memset (Device)",
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<c10::BFloat16, at::native::func_wrapper_t<float>>>",
    "void at::native::vectorized_elementwise_kernel<8, at::native::FillFunctor<c10::BFloat16>, std::array<char*, 1>>",
    (
        "void at::native::elementwise_kernel<128, 4, "
        "at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda>>"
    ),
    "flash_bwd_preprocess_kernel",
    "flash_bwd_gluon_kernel",
    "void at::native::vectorized_elementwise_kernel<8, at::native::bfloat16_copy_kernel_cuda(at::TensorIteratorBase&)>",
    (
        "void at::native::(anonymous namespace)::CatArrayBatchedCopy_vectorized<"
        "at::native::(anonymous namespace)::OpaqueType<2>>"
    ),
    (
        "void at::native::vectorized_elementwise_kernel<8, "
        "at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3>>"
    ),
]
CUDNN = [
    "Memset (Device)",
    "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x64_4x1x1_kernel0_0",
    "Memset (Device)",
    OURS[2],
    OURS[3],
    "void at::native::vectorized_elementwise_kernel<8, at::native::FillFunctor<float>, std::array<char*, 1>>",
    OURS[4],
    "Memset (Device)",
    "void cudnn::fusion::compute_dot_do_o_specialized<true, 64>(void const*, void const*, float*)",
    "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x64_4x1x1_kernel0_0",
    "void cudnn::fusion::convert_dq_to_16bits<true>(void const*, void*, unsigned int)",
    OURS[8],
    OURS[9],
]


def test_short_names_keep_the_kernel_and_the_functor_of_generic_aten_kernels():
    assert lk.short_kernel_name(OURS[0]) == "flash_fwd_gluon_kernel"
    assert lk.short_kernel_name(OURS[3]) == "vectorized_elementwise_kernel [FillFunctor]"
    assert lk.short_kernel_name(OURS[4]) == "elementwise_kernel [direct_copy_kernel_cuda]"
    assert lk.short_kernel_name(OURS[7]) == "vectorized_elementwise_kernel [bfloat16_copy_kernel_cuda]"
    assert lk.short_kernel_name(OURS[8]) == "CatArrayBatchedCopy_vectorized"
    assert lk.short_kernel_name(CUDNN[8]) == "compute_dot_do_o_specialized"


def test_ours_phases_put_only_the_steps_own_kernels_in_the_harness():
    got = lk.classify_kernels(OURS)
    assert [phase for phase, _ in got] == [
        "forward",
        "harness",
        "harness",
        "harness",
        "backward",
        "backward",
        "backward",
        "backward",
        "harness",
        "harness",
    ]
    roles = dict(zip(OURS, (role for _, role in got)))
    assert roles[OURS[4]] == "dense copy of the upstream gradient"
    assert roles[OURS[8]] == "unbind backward (stack dQ, dK, dV)"
    assert roles[OURS[9]] == "accumulate into the leaf's gradient"


def test_cudnns_own_fill_and_memsets_after_the_loss_count_as_its_backward():
    got = lk.classify_kernels(CUDNN)
    assert [phase for phase, _ in got] == [
        "forward",
        "forward",
        "harness",
        "harness",
        "harness",
        "backward",
        "backward",
        "backward",
        "backward",
        "backward",
        "backward",
        "harness",
        "harness",
    ]


def test_a_step_without_the_loss_reduction_is_refused_with_its_kernels_named():
    with pytest.raises(ValueError, match=r"no loss reduction.*flash_fwd_gluon_kernel"):
        lk.classify_kernels([OURS[0], OURS[6]])


def test_phase_summary_sums_by_phase_and_measures_the_gaps():
    kernels = pd.DataFrame(
        [
            dict(impl="a", position=0, phase="forward", role="attention", kernel="f", start_ms=0.0, ms=1.0),
            dict(impl="a", position=1, phase="harness", role="loss o.sum()", kernel="r", start_ms=1.5, ms=0.25),
            dict(impl="a", position=2, phase="backward", role="attention", kernel="b", start_ms=2.0, ms=2.0),
            dict(impl="b", position=0, phase="forward", role="attention", kernel="f", start_ms=0.0, ms=3.0),
        ],
        columns=lk.KERNEL_COLUMNS,
    )
    summary = lk.kernel_phase_summary(kernels).set_index("impl")
    assert summary.loc["a", ["forward_ms", "backward_ms", "harness_ms", "kernels_ms"]].tolist() == [
        1.0,
        2.0,
        0.25,
        3.25,
    ]
    assert summary.loc["a", "span_ms"] == 4.0 and summary.loc["a", "gaps_ms"] == 0.75
    assert summary.loc["b", "backward_ms"] == 0.0 and summary.loc["b", "gaps_ms"] == 0.0


def test_profile_text_reads_the_tables():
    kernels = pd.DataFrame(
        [
            dict(impl="triton", position=0, phase="forward", role="attention", kernel="f", start_ms=0.0, ms=1.0),
            dict(impl="triton", position=1, phase="harness", role="loss o.sum()", kernel="r", start_ms=1.0, ms=0.25),
            dict(
                impl="triton",
                position=2,
                phase="backward",
                role="dense copy of the upstream gradient",
                kernel="c",
                start_ms=1.25,
                ms=0.125,
            ),
            dict(impl="triton", position=3, phase="backward", role="attention", kernel="b", start_ms=1.375, ms=2.875),
            dict(impl="sdpa_cudnn", position=0, phase="forward", role="attention", kernel="f", start_ms=0.0, ms=1.25),
            dict(
                impl="sdpa_cudnn", position=1, phase="harness", role="loss o.sum()", kernel="r", start_ms=1.25, ms=0.25
            ),
            dict(impl="sdpa_cudnn", position=2, phase="backward", role="attention", kernel="b", start_ms=1.5, ms=3.75),
        ],
        columns=lk.KERNEL_COLUMNS,
    )
    text = lk.kernel_profile_text(kernels, lk.kernel_phase_summary(kernels), steps=5)
    assert text.startswith(
        "Medians of 5 profiled steps, each queued right behind 2 unprofiled steps (a busy GPU, as in "
        "the timed runs). The harness's kernels take 0.250 ms (triton), 0.250 ms (sdpa_cudnn)."
    )
    assert "forward 1.00 ms against 1.25 ms (0.800×), backward 3.00 ms against 3.75 ms (0.800×)" in text
    assert "attention kernels together **0.800×**" in text and "4.25 ms against 5.25 ms (0.810×)" in text
    assert "counted in the backward: 0.125 ms (triton), none (sdpa_cudnn)." in text
    assert "against the timed" not in text
    timed = pd.Series({"triton": 4.0, "sdpa_cudnn": 5.5, "sdpa_flash": 9.0})
    text = lk.kernel_profile_text(kernels, lk.kernel_phase_summary(kernels), steps=5, timed_ms=timed)
    assert (
        "The profiled kernels' sum against the timed forward+backward: 4.25 ms against 4.00 ms (1.062×, triton), "
        "5.25 ms against 5.50 ms (0.955×, sdpa_cudnn)."
    ) in text
    alone = kernels[kernels.impl == "sdpa_cudnn"]
    text = lk.kernel_profile_text(alone, lk.kernel_phase_summary(alone), steps=1)
    assert "Ours against" not in text and "counted in the backward: none (sdpa_cudnn)." in text


def test_the_profiled_steps_take_turns_in_rotated_order_after_every_warm_up(monkeypatch):
    """Warm-ups first, one step of each implementation profiled alone (its kernels' names), then one profiled
    step of each implementation per round in rotated order (the timed rounds' `round_orders`), each queued
    behind `lead_steps` unprofiled steps of its implementation, only its own last kernels kept; each
    implementation's kernels are the medians of its own rounds' steps. The step runs on CPU tensors here,
    with the profiler replaced by a recorder."""
    from cs336_systems.benchmarking.attention_registry import Implementation

    config = lk.LeaderboardConfig(heads=2, seq_len=16, head_dim=8)
    calls, leads = [], []

    def make(name, compile):
        return Implementation(name, lambda q, k, v, causal: calls.append(name) or (q * 1.0))

    def recorder(step, lead_steps=0, kernels=None):
        for _ in range(lead_steps + 1):
            step()
        leads.append((calls[-1], lead_steps, kernels))
        name, count = calls[-1], sum(c == calls[-1] for c in calls)
        names = OURS if name == "triton" else CUDNN
        # a lead step's last kernel recorded ahead of the step's own, as on a busy GPU
        events = ([("lead_kernel", -1.0, 9.0)] if lead_steps else []) + [
            (k, float(i), float(count)) for i, k in enumerate(names)
        ]
        return events[-kernels:] if kernels else events

    monkeypatch.setattr(
        lk, "leaderboard_inputs", lambda config, device: torch.randn(config.leaf_shape(), requires_grad=True)
    )
    monkeypatch.setattr(lk, "leaderboard_implementation", make)
    monkeypatch.setattr(lk, "_profiled_step", recorder)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: None)
    kernels = lk.leaderboard_kernels(["triton", "sdpa_cudnn"], config, steps=3, warmup_steps=2, lead_steps=1)
    t, c = "triton", "sdpa_cudnn"
    assert calls == [t] * 2 + [c] * 2 + [t, c] + [t, t, c, c] + [c, c, t, t] + [t, t, c, c]
    assert leads[:2] == [(t, 0, None), (c, 0, None)]
    assert leads[2:] == [
        (t, 1, len(OURS)),
        (c, 1, len(CUDNN)),
        (c, 1, len(CUDNN)),
        (t, 1, len(OURS)),
        (t, 1, len(OURS)),
        (c, 1, len(CUDNN)),
    ]
    ours = kernels[kernels.impl == "triton"]
    assert ours.kernel.tolist() == [lk.short_kernel_name(k) for k in OURS]
    assert (ours.ms == 7.0).all(), "the median of its rounds' steps: the 6th, 8th and 10th of its calls (3rd lead)"
    assert (kernels[kernels.impl == "sdpa_cudnn"].ms == 7.0).all()


def test_profiling_needs_cuda():
    with pytest.raises(ValueError, match="CUDA kernels; got device cpu"):
        lk.leaderboard_kernels(["triton"], device="cpu")


@pytest.mark.gpu
def test_a_small_step_profiles_into_the_three_phases_on_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    config = lk.LeaderboardConfig(heads=2, seq_len=1024, head_dim=64)
    kernels = lk.leaderboard_kernels(["triton", "sdpa_flash"], config, compile=False, steps=2, warmup_steps=1)
    for impl, group in kernels.groupby("impl"):
        assert {"forward", "backward", "harness"} <= set(group.phase), impl
        assert (group.ms > 0).all() and group.position.tolist() == list(range(len(group)))
    summary = lk.kernel_phase_summary(kernels)
    assert (summary.span_ms >= summary.kernels_ms - 1e-9).all()
