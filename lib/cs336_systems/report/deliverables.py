"""The deliverable map of both CS336 assignment 2 handouts (spring 2025 and spring 2026), as data.

Every `Problem (...)` of each handout appears here in the handout's order, split into its lettered
sub-parts (a), (b), ... in order; a problem without lettered parts is one deliverable with part "".
Each deliverable says in one sentence of our own what it asks, the form of the answer it expects,
the notebook that answers it and the key of that answer. Neither handout gives points to a
sub-part, so `points` is None throughout; a problem's points are in `PROBLEM_POINTS`.

One deliverable is not a `Problem (...)`: the 2025 handout's FlashAttention-2 leaderboard (its
section "FlashAttention-2 Leaderboard", a submission with no points stated) is listed under the
problem name "leaderboard", after `flash_benchmarking` where the handout places it, and is absent
from `PROBLEM_POINTS`.

Answer keys. A deliverable's answer key is `problem.part` (just `problem` when part is ""). A 2026
sub-part that asks the same thing at the same settings as its 2025 counterpart shares the 2025 key,
so one answer serves both writeups. Where the 2026 handout changed what a 2025 sub-part measures
(its model sizes: 2026's xl is d_model 2560 / d_ff 10240 / 32 layers / 32 heads and a 10B size is
added; its context lengths; the optimizer step added to the timed step; the DDP and sharding
experiments run on that new xl), the 2026 entry's key is `problem.part.2026` and the 2025 entry
keeps `problem.part`. Problems and parts new in 2026 take plain keys, except `leaderboard`: the 2026
problem of that name times an 8B training step, not the 2025 FlashAttention-2 leaderboard, so its
key is `leaderboard.2026`.

Judgement calls where the 2026 text differs but the key is shared:
`distributed_communication_single_node` (2026 keeps only the NCCL/GPU half of the 2025 sweep, which
the 2025 answer contains) and `flash_benchmarking.a` (2026 names a B200 instead of an H100; the sweep
is the same, and the answer is measured on the GPU at hand). `pytorch_attention.a`,
`torch_compile.a` and `optimizer_state_sharding_accounting.c` name no model size, so they are shared.
"""

from __future__ import annotations

from dataclasses import dataclass

FORMS = ("code", "sentences", "table", "plot", "derivation", "number")


@dataclass(frozen=True)
class Deliverable:
    handout: str  # "2025" or "2026"
    problem: str  # the handout's problem name, e.g. "benchmarking_script"
    part: str  # the sub-part letter, "a", "b", ...; "" for a problem with no lettered parts
    points: float | None  # the sub-part's points where the handout states them, else None
    asks: str  # one short sentence of what is asked, in our own words
    form: str  # one of FORMS: the main form of the deliverable
    notebook: str  # the stem of the notebook that answers it, e.g. "01_benchmarking_script"
    answer: str  # the key of the answer (see the module docstring)

    @property
    def id(self) -> str:
        return f"{self.handout}/{self.problem}" + (f".{self.part}" if self.part else "")


HANDOUT_TITLES: dict[str, str] = {
    "2025": "CS336 Spring 2025, Assignment 2: Systems and Parallelism",
    "2026": "CS336 Spring 2026, Assignment 2: Systems and Parallelism",
}

PROBLEM_POINTS: dict[str, dict[str, float]] = {
    "2025": {
        "benchmarking_script": 4,
        "nsys_profile": 5,
        "mixed_precision_accumulation": 1,
        "benchmarking_mixed_precision": 2,
        "memory_profiling": 4,
        "pytorch_attention": 2,
        "torch_compile": 2,
        "flash_forward": 15,
        "flash_backward": 5,
        "flash_benchmarking": 5,
        "distributed_communication_single_node": 5,
        "naive_ddp": 5,
        "naive_ddp_benchmarking": 3,
        "minimal_ddp_flat_benchmarking": 2,
        "ddp_overlap_individual_parameters": 5,
        "ddp_overlap_individual_parameters_benchmarking": 1,
        "ddp_overlap_bucketed": 8,
        "ddp_bucketed_benchmarking": 3,
        "communication_accounting": 10,
        "optimizer_state_sharding": 15,
        "optimizer_state_sharding_accounting": 5,
    },
    "2026": {
        "benchmarking_script": 4,
        "nsys_profile": 5,
        "mixed_precision_accumulation": 1,
        "benchmarking_mixed_precision": 2,
        "memory_profiling": 4,
        "gradient_checkpointing": 4,
        "pytorch_attention": 2,
        "torch_compile": 2,
        "flash_forward": 15,
        "flash_backward": 5,
        "flash_benchmarking": 5,
        "distributed_communication_single_node": 5,
        "naive_ddp": 5,
        "naive_ddp_benchmarking": 3,
        "minimal_ddp_flat_benchmarking": 2,
        "ddp_overlap_individual_parameters": 5,
        "ddp_overlap_individual_parameters_benchmarking": 1,
        "optimizer_state_sharding": 15,
        "optimizer_state_sharding_accounting": 5,
        "fsdp": 15,
        "fsdp_accounting": 5,
        "alternate_ring_all_reduce": 1,
        "data_parallel_calcs": 3,
        "fsdp_calcs": 3,
        "tp_calcs": 4,
        "fsdp_tp_calcs": 6,
        "leaderboard": 10,
    },
}

# One row per deliverable, in the handout's order:
# (problem, part, form, notebook, answer key, what it asks).
_2025 = [
    (
        "benchmarking_script",
        "a",
        "code",
        "01_benchmarking_script",
        "benchmarking_script.a",
        "Build a harness that creates a model from given hyperparameters, feeds it random tokens, and times forward "
        "or forward+backward after warm-up.",
    ),
    (
        "benchmarking_script",
        "b",
        "sentences",
        "01_benchmarking_script",
        "benchmarking_script.b",
        "Report the mean and spread of forward and backward times for every model size, with 5 warm-up and 10 timed "
        "steps.",
    ),
    (
        "benchmarking_script",
        "c",
        "sentences",
        "01_benchmarking_script",
        "benchmarking_script.c",
        "Explain how dropping the warm-up, or keeping only one or two warm-up steps, changes the measured times and "
        "why.",
    ),
    (
        "nsys_profile",
        "a",
        "sentences",
        "02_nsys_profile",
        "nsys_profile.a",
        "Give the profiler's total forward time across sizes and contexts and check it against the Python-timer "
        "measurement.",
    ),
    (
        "nsys_profile",
        "b",
        "sentences",
        "02_nsys_profile",
        "nsys_profile.b",
        "Name the kernel with the largest share of forward GPU time, its calls per forward, and whether adding "
        "backward changes the leader.",
    ),
    (
        "nsys_profile",
        "c",
        "sentences",
        "02_nsys_profile",
        "nsys_profile.c",
        "List the non-matmul kernels that still take a noticeable part of forward GPU time.",
    ),
    (
        "nsys_profile",
        "d",
        "sentences",
        "02_nsys_profile",
        "nsys_profile.d",
        "Profile a full AdamW training step and compare its matmul share, and other kernels' shares, with forward-only "
        "inference.",
    ),
    (
        "nsys_profile",
        "e",
        "sentences",
        "02_nsys_profile",
        "nsys_profile.e",
        "Compare the attention softmax's runtime with its two matmuls, relative to how their FLOP counts differ.",
    ),
    (
        "mixed_precision_accumulation",
        "",
        "sentences",
        "03_mixed_precision_accumulation",
        "mixed_precision_accumulation",
        "Run the four fp16/fp32 accumulation loops and comment on how accurate each sum comes out.",
    ),
    (
        "benchmarking_mixed_precision",
        "a",
        "table",
        "04_benchmarking_mixed_precision",
        "benchmarking_mixed_precision.a",
        "List the dtype of the parameters, fc1 output, LayerNorm output, logits, loss and gradients of the toy model "
        "under fp16 autocast.",
    ),
    (
        "benchmarking_mixed_precision",
        "b",
        "sentences",
        "04_benchmarking_mixed_precision",
        "benchmarking_mixed_precision.b",
        "Explain which layer-norm operations are precision sensitive and whether bf16 still needs them treated "
        "specially.",
    ),
    (
        "benchmarking_mixed_precision",
        "c",
        "sentences",
        "04_benchmarking_mixed_precision",
        "benchmarking_mixed_precision.c",
        "Time forward and backward in fp32 and with bf16 autocast for every size, and describe how the gap moves with "
        "size.",
    ),
    (
        "memory_profiling",
        "a",
        "plot",
        "05_memory_profiling",
        "memory_profiling.a",
        "Show active-memory timelines of 2.7B inference and of a whole training step, and say which phases the peaks "
        "reveal.",
    ),
    (
        "memory_profiling",
        "b",
        "table",
        "05_memory_profiling",
        "memory_profiling.b",
        "Tabulate the 2.7B model's peak memory for forward-only and for a full training step at each context length.",
    ),
    (
        "memory_profiling",
        "c",
        "sentences",
        "05_memory_profiling",
        "memory_profiling.c",
        "Measure 2.7B peak memory of forward and training step under mixed precision and judge whether it matters "
        "much.",
    ),
    (
        "memory_profiling",
        "d",
        "derivation",
        "05_memory_profiling",
        "memory_profiling.d",
        "Derive the size in MiB of one fp32 residual-stream activation of the 2.7B model at the reference settings.",
    ),
    (
        "memory_profiling",
        "e",
        "sentences",
        "05_memory_profiling",
        "memory_profiling.e",
        "Find the largest allocations in the 2.7B forward-pass snapshot and trace which code creates them.",
    ),
    (
        "pytorch_attention",
        "a",
        "table",
        "07_pytorch_attention",
        "pytorch_attention.a",
        "Time naive attention over a head-dimension by sequence-length grid, find where memory runs out, account for "
        "that memory, and propose a remedy.",
    ),
    (
        "torch_compile",
        "a",
        "table",
        "08_torch_compile",
        "torch_compile.a",
        "Compare compiled and eager naive attention, forward and backward, on the attention benchmark's grid.",
    ),
    (
        "torch_compile",
        "b",
        "table",
        "08_torch_compile",
        "torch_compile.b",
        "Compare eager and compiled Transformer timings for forward, forward+backward and a full training step across "
        "model sizes.",
    ),
    (
        "flash_forward",
        "a",
        "code",
        "09_flash_attention",
        "flash_forward.a",
        "Implement the tiled FlashAttention-2 forward as a pure-PyTorch autograd.Function that saves the logsumexp and "
        "passes the given test.",
    ),
    (
        "flash_forward",
        "b",
        "code",
        "09_flash_attention",
        "flash_forward.b",
        "Implement the same forward as one fused Triton kernel behind its own autograd.Function.",
    ),
    (
        "flash_forward",
        "c",
        "code",
        "09_flash_attention",
        "flash_forward.c",
        "Add an optional causal-masking flag, off by default, to the Triton forward.",
    ),
    (
        "flash_backward",
        "",
        "code",
        "09_flash_attention",
        "flash_backward",
        "Implement the recomputation-based FlashAttention-2 backward in torch.compile'd PyTorch, returning dQ, dK and "
        "dV.",
    ),
    (
        "flash_benchmarking",
        "a",
        "table",
        "10_flash_benchmarking",
        "flash_benchmarking.a",
        "Benchmark Triton FlashAttention-2 against plain PyTorch attention with do_bench over sequence length, head "
        "dimension and precision, causal, batch 1.",
    ),
    (
        "leaderboard",
        "",
        "number",
        "11_leaderboard",
        "leaderboard",
        "Submit the fastest causal bf16 forward+backward time of your FlashAttention-2 at the leaderboard's fixed "
        "shape.",
    ),
    (
        "distributed_communication_single_node",
        "",
        "plot",
        "12_distributed_communication",
        "distributed_communication_single_node",
        "Benchmark all-reduce over tensor sizes, process counts and Gloo/NCCL backends, and comment on how these "
        "factors interact.",
    ),
    (
        "naive_ddp",
        "",
        "code",
        "13_naive_ddp",
        "naive_ddp",
        "Write DDP training that all-reduces each parameter's gradient after backward, and show it matches "
        "single-process training on a toy model.",
    ),
    (
        "naive_ddp_benchmarking",
        "",
        "sentences",
        "13_naive_ddp",
        "naive_ddp_benchmarking",
        "Measure the step time and the share spent communicating gradients for naive DDP with the XL model on two "
        "GPUs.",
    ),
    (
        "minimal_ddp_flat_benchmarking",
        "",
        "sentences",
        "13_naive_ddp",
        "minimal_ddp_flat_benchmarking",
        "Repeat that measurement with one all-reduce of all flattened gradients and compare it with per-parameter "
        "communication.",
    ),
    (
        "ddp_overlap_individual_parameters",
        "",
        "code",
        "14_ddp_overlap_individual",
        "ddp_overlap_individual_parameters",
        "Build a DDP wrapper that broadcasts the initial weights and launches asynchronous per-parameter all-reduces "
        "during backward.",
    ),
    (
        "ddp_overlap_individual_parameters_benchmarking",
        "a",
        "sentences",
        "14_ddp_overlap_individual",
        "ddp_overlap_individual_parameters_benchmarking.a",
        "Time the overlapping DDP step and compare it with naive and flattened DDP on the same two-GPU XL setup.",
    ),
    (
        "ddp_overlap_individual_parameters_benchmarking",
        "b",
        "plot",
        "14_ddp_overlap_individual",
        "ddp_overlap_individual_parameters_benchmarking.b",
        "Show profiler traces contrasting naive DDP, whose communication waits for backward, with the overlapping one.",
    ),
    (
        "ddp_overlap_bucketed",
        "",
        "code",
        "15_ddp_bucketed",
        "ddp_overlap_bucketed",
        "Build a DDP wrapper that groups gradients into size-capped buckets and all-reduces each bucket asynchronously "
        "once it is ready.",
    ),
    (
        "ddp_bucketed_benchmarking",
        "a",
        "table",
        "15_ddp_bucketed",
        "ddp_bucketed_benchmarking.a",
        "Time bucketed DDP for bucket caps from 1 to 1000 MB, compare with the earlier variants, and explain any gap "
        "from expectations.",
    ),
    (
        "ddp_bucketed_benchmarking",
        "b",
        "derivation",
        "15_ddp_bucketed",
        "ddp_bucketed_benchmarking.b",
        "Model DDP's post-backward overhead from model size, bandwidth, per-call latency and bucket count, then derive "
        "the best bucket size.",
    ),
    (
        "communication_accounting",
        "a",
        "derivation",
        "18_communication_accounting",
        "communication_accounting.a",
        "Compute the XXL FFN stack's FP32 training-state memory and bf16 saved activations, and how many 80GB H100s "
        "that equals.",
    ),
    (
        "communication_accounting",
        "b",
        "derivation",
        "18_communication_accounting",
        "communication_accounting.b",
        "Express per-device memory with state and half the activations sharded over N_FSDP, and find the N_FSDP that "
        "fits a 95GB v5p.",
    ),
    (
        "communication_accounting",
        "c",
        "derivation",
        "18_communication_accounting",
        "communication_accounting.c",
        "With v5p bandwidth and FLOP/s on a 16x4 FSDP-by-TP mesh, find the per-device and total batch where the "
        "forward turns compute bound.",
    ),
    (
        "communication_accounting",
        "d",
        "sentences",
        "18_communication_accounting",
        "communication_accounting.d",
        "Argue, with references or equations, which techniques shrink the global batch while staying compute bound.",
    ),
    (
        "optimizer_state_sharding",
        "",
        "code",
        "16_optimizer_state_sharding",
        "optimizer_state_sharding",
        "Implement an optimizer wrapper that keeps state only for this rank's parameter shard and broadcasts the "
        "updated parameters afterwards.",
    ),
    (
        "optimizer_state_sharding_accounting",
        "a",
        "sentences",
        "16_optimizer_state_sharding",
        "optimizer_state_sharding_accounting.a",
        "Report peak memory after init, before and after the optimizer step, with and without sharding, broken down by "
        "component, for XL on two GPUs.",
    ),
    (
        "optimizer_state_sharding_accounting",
        "b",
        "sentences",
        "16_optimizer_state_sharding",
        "optimizer_state_sharding_accounting.b",
        "Measure how sharding the optimizer state changes the step time for XL on two GPUs.",
    ),
    (
        "optimizer_state_sharding_accounting",
        "c",
        "sentences",
        "16_optimizer_state_sharding",
        "optimizer_state_sharding_accounting.c",
        "Explain how this sharding scheme differs from ZeRO stage 1 in memory and in communication volume.",
    ),
]

_2026 = [
    # The timed step now includes the optimizer, over 2026's size table: all three parts changed.
    (
        "benchmarking_script",
        "a",
        "code",
        "01_benchmarking_script",
        "benchmarking_script.a.2026",
        "Build a harness that times forward-only, forward+backward, or a full step with the optimizer, on a model "
        "built from given hyperparameters and random data.",
    ),
    (
        "benchmarking_script",
        "b",
        "sentences",
        "01_benchmarking_script",
        "benchmarking_script.b.2026",
        "Report the mean and spread of forward, backward and optimizer-step times for each 2026 model size, 5 warm-up "
        "and 10 timed steps.",
    ),
    (
        "benchmarking_script",
        "c",
        "sentences",
        "01_benchmarking_script",
        "benchmarking_script.c.2026",
        "Redo the 2026 timings with no warm-up and with one or two warm-up steps, and explain the differences.",
    ),
    # Two sizes of one's choice and three contexts above 128, the largest the longest that fits, instead of every
    # size at 128-1024.
    (
        "nsys_profile",
        "a",
        "sentences",
        "02_nsys_profile",
        "nsys_profile.a.2026",
        "For two chosen sizes at three contexts above 128 up to the longest that fits, compare profiled and "
        "Python-timer forward times.",
    ),
    (
        "nsys_profile",
        "b",
        "sentences",
        "02_nsys_profile",
        "nsys_profile.b.2026",
        "Identify the top forward kernel by GPU time, its calls per forward, and whether it stays on top once backward "
        "is included.",
    ),
    (
        "nsys_profile",
        "c",
        "sentences",
        "02_nsys_profile",
        "nsys_profile.c.2026",
        "List the non-matmul kernels taking a noticeable share of forward GPU time in these profiles.",
    ),
    (
        "nsys_profile",
        "d",
        "sentences",
        "02_nsys_profile",
        "nsys_profile.d.2026",
        "Compare the matmul share of a full AdamW step with forward-only inference, and note how other kernels shift.",
    ),
    (
        "nsys_profile",
        "e",
        "sentences",
        "02_nsys_profile",
        "nsys_profile.e.2026",
        "Contrast the attention softmax's runtime with its matmuls against their FLOP ratio in these profiles.",
    ),
    (
        "mixed_precision_accumulation",
        "",
        "sentences",
        "03_mixed_precision_accumulation",
        "mixed_precision_accumulation",
        "Run the four fp16/fp32 accumulation loops and comment on how accurate each sum comes out.",
    ),
    (
        "benchmarking_mixed_precision",
        "a",
        "table",
        "04_benchmarking_mixed_precision",
        "benchmarking_mixed_precision.a",
        "List the dtype of the parameters, fc1 output, LayerNorm output, logits, loss and gradients of the toy model "
        "under fp16 autocast.",
    ),
    (
        "benchmarking_mixed_precision",
        "b",
        "sentences",
        "04_benchmarking_mixed_precision",
        "benchmarking_mixed_precision.b",
        "Explain which layer-norm operations are precision sensitive and whether bf16 still needs them treated "
        "specially.",
    ),
    (
        "benchmarking_mixed_precision",
        "c",
        "sentences",
        "04_benchmarking_mixed_precision",
        "benchmarking_mixed_precision.c.2026",
        "Time forward and backward in fp32 and with bf16 autocast across the 2026 sizes, and discuss how the speed-up "
        "trends with size.",
    ),
    # The xl model (2025's 2.7B shape) at contexts 128 and 2048 instead of 2.7B at 128, 256 and 512.
    (
        "memory_profiling",
        "a",
        "plot",
        "05_memory_profiling",
        "memory_profiling.a.2026",
        "Show xl active-memory timelines of inference and of a whole training step, and say which phases the peaks "
        "reveal.",
    ),
    (
        "memory_profiling",
        "b",
        "table",
        "05_memory_profiling",
        "memory_profiling.b.2026",
        "Tabulate xl peak memory for forward-only and for a full training step at contexts 128 and 2048.",
    ),
    (
        "memory_profiling",
        "c",
        "sentences",
        "05_memory_profiling",
        "memory_profiling.c.2026",
        "Measure xl peak memory under bf16 mixed precision for forward and training step, and judge the effect.",
    ),
    (
        "memory_profiling",
        "d",
        "derivation",
        "05_memory_profiling",
        "memory_profiling.d.2026",
        "Derive the MiB size of one fp32 residual-stream activation of the xl model at the reference settings.",
    ),
    (
        "memory_profiling",
        "e",
        "sentences",
        "05_memory_profiling",
        "memory_profiling.e.2026",
        "Find the largest allocations in an xl forward snapshot and trace where in the code they originate.",
    ),
    (
        "memory_profiling",
        "f",
        "sentences",
        "05_memory_profiling",
        "memory_profiling.f",
        "With Nsight memory tracing, measure one block's saved-for-backward memory and its top five sources, "
        "then infer the block's gradient memory.",
    ),
    (
        "gradient_checkpointing",
        "a",
        "sentences",
        "06_gradient_checkpointing",
        "gradient_checkpointing.a",
        "Describe the nested checkpoint layout minimising peak activation memory over N blocks, its asymptotic memory "
        "and compute, with a code sketch.",
    ),
    (
        "gradient_checkpointing",
        "b",
        "sentences",
        "06_gradient_checkpointing",
        "gradient_checkpointing.b",
        "Pick the best single-level checkpoint block size for xl at batch 4, context 2048, confirmed by measured peaks "
        "of neighbouring sizes.",
    ),
    (
        "pytorch_attention",
        "a",
        "table",
        "07_pytorch_attention",
        "pytorch_attention.a",
        "Time naive attention over a head-dimension by sequence-length grid, find where memory runs out, account for "
        "that memory, and propose a remedy.",
    ),
    (
        "torch_compile",
        "a",
        "table",
        "08_torch_compile",
        "torch_compile.a",
        "Compare compiled and eager naive attention, forward and backward, on the attention benchmark's grid.",
    ),
    (
        "torch_compile",
        "b",
        "table",
        "08_torch_compile",
        "torch_compile.b.2026",
        "Compare eager and compiled Transformer timings for forward, forward+backward and a full training step across "
        "the 2026 model sizes.",
    ),
    (
        "flash_forward",
        "a",
        "code",
        "09_flash_attention",
        "flash_forward.a",
        "Implement the tiled FlashAttention-2 forward as a pure-PyTorch autograd.Function that saves the logsumexp and "
        "passes the given test.",
    ),
    (
        "flash_forward",
        "b",
        "code",
        "09_flash_attention",
        "flash_forward.b",
        "Implement the same forward as one fused Triton kernel behind its own autograd.Function.",
    ),
    (
        "flash_forward",
        "c",
        "code",
        "09_flash_attention",
        "flash_forward.c",
        "Add an optional causal-masking flag, off by default, to the Triton forward.",
    ),
    (
        "flash_backward",
        "",
        "code",
        "09_flash_attention",
        "flash_backward",
        "Implement the recomputation-based FlashAttention-2 backward in torch.compile'd PyTorch, returning dQ, dK and "
        "dV.",
    ),
    # Shared with 2025: the same sweep; 2026 names a B200 where 2025 named an H100.
    (
        "flash_benchmarking",
        "a",
        "table",
        "10_flash_benchmarking",
        "flash_benchmarking.a",
        "Benchmark Triton FlashAttention-2 against plain PyTorch attention with do_bench over sequence length, head "
        "dimension and precision, causal, batch 1.",
    ),
    # Shared with 2025: 2026 drops the Gloo/CPU backend, keeping the NCCL half of the same sweep.
    (
        "distributed_communication_single_node",
        "",
        "plot",
        "12_distributed_communication",
        "distributed_communication_single_node",
        "Benchmark NCCL all-reduce over tensor sizes and GPU counts, and comment on how the two factors interact.",
    ),
    (
        "naive_ddp",
        "",
        "code",
        "13_naive_ddp",
        "naive_ddp",
        "Write DDP training that all-reduces each parameter's gradient after backward, and show it matches "
        "single-process training on a toy model.",
    ),
    # The DDP and sharding measurements below run on 2026's xl (d_model 2560, 32 layers), not 2025's XL.
    (
        "naive_ddp_benchmarking",
        "",
        "sentences",
        "13_naive_ddp",
        "naive_ddp_benchmarking.2026",
        "Measure the step time and gradient-communication share for naive DDP with the 2026 xl model on two GPUs.",
    ),
    (
        "minimal_ddp_flat_benchmarking",
        "",
        "sentences",
        "13_naive_ddp",
        "minimal_ddp_flat_benchmarking.2026",
        "With the 2026 xl model on two GPUs, compare one flattened all-reduce against per-parameter all-reduces.",
    ),
    (
        "ddp_overlap_individual_parameters",
        "",
        "code",
        "14_ddp_overlap_individual",
        "ddp_overlap_individual_parameters",
        "Build a DDP wrapper that broadcasts the initial weights and launches asynchronous per-parameter all-reduces "
        "during backward.",
    ),
    (
        "ddp_overlap_individual_parameters_benchmarking",
        "a",
        "sentences",
        "14_ddp_overlap_individual",
        "ddp_overlap_individual_parameters_benchmarking.a.2026",
        "Time the overlapping DDP step against naive and flattened DDP with the 2026 xl model on two GPUs.",
    ),
    (
        "ddp_overlap_individual_parameters_benchmarking",
        "b",
        "plot",
        "14_ddp_overlap_individual",
        "ddp_overlap_individual_parameters_benchmarking.b.2026",
        "Show 2026 xl profiler traces contrasting naive DDP, whose communication waits for backward, with the "
        "overlapping one.",
    ),
    (
        "optimizer_state_sharding",
        "",
        "code",
        "16_optimizer_state_sharding",
        "optimizer_state_sharding",
        "Implement an optimizer wrapper that keeps state only for this rank's parameter shard and broadcasts the "
        "updated parameters afterwards.",
    ),
    (
        "optimizer_state_sharding_accounting",
        "a",
        "sentences",
        "16_optimizer_state_sharding",
        "optimizer_state_sharding_accounting.a.2026",
        "Report peak memory after init, before and after the optimizer step, with and without sharding, broken down by "
        "component, for 2026 xl.",
    ),
    (
        "optimizer_state_sharding_accounting",
        "b",
        "sentences",
        "16_optimizer_state_sharding",
        "optimizer_state_sharding_accounting.b.2026",
        "Measure how sharding the optimizer state changes the step time for the 2026 xl model on two GPUs.",
    ),
    (
        "optimizer_state_sharding_accounting",
        "c",
        "sentences",
        "16_optimizer_state_sharding",
        "optimizer_state_sharding_accounting.c",
        "Explain how this sharding scheme differs from ZeRO stage 1 in memory and in communication volume.",
    ),
    (
        "fsdp",
        "",
        "code",
        "17_fsdp",
        "fsdp",
        "Implement an FSDP wrapper sharding linear and embedding weights, prefetching all-gathers, reduce-scattering "
        "gradients, optionally computing in low precision.",
    ),
    (
        "fsdp_accounting",
        "a",
        "sentences",
        "17_fsdp",
        "fsdp_accounting.a",
        "Estimate how much peak memory FSDP should save, building on the optimizer-sharding analysis.",
    ),
    (
        "fsdp_accounting",
        "b",
        "sentences",
        "17_fsdp",
        "fsdp_accounting.b",
        (
            "Profile xl on two GPUs and show with Nsight whether weight all-gathers complete before the forward "
            "needs them."
        ),
    ),
    (
        "alternate_ring_all_reduce",
        "",
        "derivation",
        "19_parallelism_calcs",
        "alternate_ring_all_reduce",
        "Find the run time, in S, N and W, of the ring all-reduce variant that passes whole input tensors around.",
    ),
    (
        "data_parallel_calcs",
        "a",
        "derivation",
        "19_parallelism_calcs",
        "data_parallel_calcs.a",
        "Count the FFN's backward matmul FLOPs per device under N_DP-way data parallelism.",
    ),
    (
        "data_parallel_calcs",
        "b",
        "derivation",
        "19_parallelism_calcs",
        "data_parallel_calcs.b",
        "Give the backward-pass communication time of data parallelism for the FFN.",
    ),
    (
        "data_parallel_calcs",
        "c",
        "derivation",
        "19_parallelism_calcs",
        "data_parallel_calcs.c",
        "Bound N_DP so that gradient communication stays hidden behind compute.",
    ),
    (
        "fsdp_calcs",
        "a",
        "derivation",
        "19_parallelism_calcs",
        "fsdp_calcs.a",
        "Count forward and backward matmul FLOPs per device under N_FSDP-way FSDP.",
    ),
    (
        "fsdp_calcs",
        "b",
        "derivation",
        "19_parallelism_calcs",
        "fsdp_calcs.b",
        "Give the forward and backward communication times under FSDP.",
    ),
    (
        "fsdp_calcs",
        "c",
        "derivation",
        "19_parallelism_calcs",
        "fsdp_calcs.c",
        "Bound N_FSDP for the forward and for the backward pass to remain compute bound.",
    ),
    (
        "tp_calcs",
        "a",
        "derivation",
        "19_parallelism_calcs",
        "tp_calcs.a",
        "Write the sharded backward pass of the column-then-row tensor-parallel FFN, collectives included.",
    ),
    (
        "tp_calcs",
        "b",
        "derivation",
        "19_parallelism_calcs",
        "tp_calcs.b",
        "Count per-device forward and backward FLOPs under N_TP-way tensor parallelism.",
    ),
    (
        "tp_calcs",
        "c",
        "derivation",
        "19_parallelism_calcs",
        "tp_calcs.c",
        "Give the forward and backward communication times under tensor parallelism.",
    ),
    (
        "tp_calcs",
        "d",
        "derivation",
        "19_parallelism_calcs",
        "tp_calcs.d",
        "Bound N_TP for the forward and for the backward pass to stay compute bound.",
    ),
    (
        "fsdp_tp_calcs",
        "a",
        "derivation",
        "19_parallelism_calcs",
        "fsdp_tp_calcs.a",
        "Count per-device forward FLOPs when FSDP and tensor parallelism are combined.",
    ),
    (
        "fsdp_tp_calcs",
        "b",
        "derivation",
        "19_parallelism_calcs",
        "fsdp_tp_calcs.b",
        "Give the forward communication time when FSDP and TP collectives overlap, as the larger of two costs.",
    ),
    (
        "fsdp_tp_calcs",
        "c",
        "derivation",
        "19_parallelism_calcs",
        "fsdp_tp_calcs.c",
        "With overlapping axes and the best split, bound the total device count before communication dominates.",
    ),
    (
        "fsdp_tp_calcs",
        "d",
        "derivation",
        "19_parallelism_calcs",
        "fsdp_tp_calcs.d",
        "Redo the device-count bound when FSDP and TP collectives share the network and cannot overlap.",
    ),
    # Not the 2025 FlashAttention-2 leaderboard (key "leaderboard"): the 8B training step.
    (
        "leaderboard",
        "",
        "number",
        "20_leaderboard_8b",
        "leaderboard.2026",
        "Report your fastest complete 8B training step (forward, loss, backward, AdamW) at batch 2 on two GPUs.",
    ),
]

DELIVERABLES: tuple[Deliverable, ...] = tuple(
    Deliverable(
        handout=handout, problem=problem, part=part, points=None, asks=asks, form=form, notebook=notebook, answer=answer
    )
    for handout, rows in (("2025", _2025), ("2026", _2026))
    for problem, part, form, notebook, answer, asks in rows
)


def _check() -> None:
    seen: set[str] = set()
    for d in DELIVERABLES:
        if d.id in seen:
            raise AssertionError(f"deliverable {d.id} is listed twice")
        seen.add(d.id)
        if d.form not in FORMS:
            raise AssertionError(f"{d.id}: form {d.form!r} is not one of {FORMS}")
        if d.handout not in HANDOUT_TITLES:
            raise AssertionError(f"{d.id}: unknown handout {d.handout!r}")


_check()


def deliverables(handout: str) -> list[Deliverable]:
    """One handout's deliverables, in its problem order and part order."""
    if handout not in HANDOUT_TITLES:
        raise ValueError(f"unknown handout {handout!r}; the known ones are {', '.join(sorted(HANDOUT_TITLES))}")
    return [d for d in DELIVERABLES if d.handout == handout]


def problems(handout: str) -> list[str]:
    """One handout's problem names, in its order."""
    return list(dict.fromkeys(d.problem for d in deliverables(handout)))


def answer_keys() -> set[str]:
    """Every answer key used by either handout."""
    return {d.answer for d in DELIVERABLES}
