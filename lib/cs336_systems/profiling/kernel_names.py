"""What a GPU kernel (or CPU operator) name says: a short display name and a category.

CUDA kernel names are demangled C++ templates, e.g.

    void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float, float, float,
        at::native::binary_internal::MulFunctor<float> >, std::array<char*, 3ul> >(int, ...)

`short_kernel_name` keeps the kernel's own name plus the functor that says what it computes
("vectorized_elementwise_kernel [MulFunctor]"); `kernel_category` sorts kernels (and, on CPU,
aten operators) into matmul / elementwise / reduction / softmax / copy / communication / ...
by name, so summaries can report the matmul share of GPU time.
"""

from __future__ import annotations

import re

CATEGORIES = (
    "matmul",
    "attention",
    "softmax",
    "reduction",
    "elementwise",
    "copy",
    "communication",
    "optimizer",
    "other",
)

# Patterns are tried in order; the first that matches names the category.
_CATEGORY_PATTERNS: list[tuple[str, re.Pattern]] = [
    # Autograd nodes on a CPU trace ("autograd::engine::evaluate_function: MmBackward0") are
    # sorted by the operation they differentiate; view nodes move no data.
    (
        "other",
        re.compile(
            r"(^|: )(View|UnsafeView|Permute|Transpose|Squeeze|Unsqueeze|Expand|Reshape|Alias|T|Slice|Select|AsStrided)"
            r"Backward\d*$"
        ),
    ),
    ("matmul", re.compile(r"(^|: )(Mm|Bmm|Addmm|Baddbmm|Matmul|Linear)Backward\d*$")),
    ("reduction", re.compile(r"(^|: )(Sum|Mean|Amax|Max|Min|Logsumexp|Norm)Backward\d*$")),
    ("copy", re.compile(r"(^|: )(Gather|Index|Embedding|Cat|Stack|Copy|ToCopy|Clone)Backward\d*$")),
    ("elementwise", re.compile(r"(^|: )\w+Backward\d*$")),
    ("communication", re.compile(r"nccl|all_?reduce|all_?gather|reduce_?scatter|broadcast|c10d::|gloo", re.I)),
    ("attention", re.compile(r"flash|fmha|attention|sdpa|_efficient_attention|_attn_fwd|_attn_bwd", re.I)),
    (
        "matmul",
        re.compile(
            r"gemm|nvjet|cutlass|xmma|cublas|wgmma|sgemm|hgemm|"
            r"aten::(mm|bmm|addmm|baddbmm|addbmm|_scaled_mm|matmul|linear)$|triton_\w*_mm(_|$)|(^|_)bmm(_|$)",
            re.I,
        ),
    ),
    ("softmax", re.compile(r"softmax", re.I)),
    ("optimizer", re.compile(r"multi_tensor_apply|fused_adam|adamw|_foreach_", re.I)),
    (
        "reduction",
        re.compile(
            r"reduce_kernel|reduction|aten::(sum|mean|amax|amin|max|min|norm|logsumexp|var|std)$|triton_(per|red)_",
            re.I,
        ),
    ),
    (
        "copy",
        re.compile(
            r"memcpy|memset|copy|cat_|CatArray|aten::(copy_|to|_to_copy|contiguous|clone|cat|stack)$|index|gather|scatter|embedding",
            re.I,
        ),
    ),
    (
        "elementwise",
        re.compile(
            r"elementwise|unrolled|vectorized|triton_poi_|triu_tril|aten::(add|sub|rsub|mul|div|neg|exp|log|pow|sqrt|rsqrt|"
            r"reciprocal|sigmoid|silu|tanh|gelu|relu|sin|cos|abs|clamp|maximum|minimum|where|masked_fill|tril|triu|"
            r"fill|zero|ones|zeros|full|addcmul|addcdiv|lerp|eq|ne|lt|le|gt|ge|bitwise_not|logical_not|"
            r"\w+_backward)_?$",
            re.I,
        ),
    ),
]

# Generic wrapper kernels whose own name says little; the functor inside says what they compute.
_GENERIC = re.compile(
    r"elementwise_kernel|unrolled_elementwise|reduce_kernel|index_elementwise|kernel2?$|Kernel2?$", re.I
)
_FUNCTOR = re.compile(r"(\w+Functor\w*|\w+Ops?\b|\w+_kernel_cuda\w*|\w+_kernel_impl\w*|\w+Epilogue)", re.I)
_SKIP_FUNCTORS = {
    "gpu_kernel_impl",
    "gpu_kernel_impl_nocast",
    "BinaryFunctor",
    "UnaryFunctor",
    "ReduceOp",
    "AUnaryFunctor",
    "BUnaryFunctor",
    "CUDAFunctorOnSelf_add",
    "CUDAFunctorOnOther_add",
}


def kernel_category(name: str) -> str:
    """One of CATEGORIES for a CUDA kernel name or an aten operator name."""
    for category, pattern in _CATEGORY_PATTERNS:
        if pattern.search(name):
            return category
    return "other"


def short_kernel_name(name: str, max_len: int = 80) -> str:
    """The kernel's own name without namespaces and template arguments, plus its functor if generic.

    Names that are not C++ signatures (aten operators, "Memcpy HtoD ...", Triton kernels) are kept.
    """
    full = name.strip()
    if full.startswith("void ") or "<" in full:
        full = re.sub(r"^void\s+", "", full).replace("(anonymous namespace)::", "")
        base = re.split(r"[<(]", full, maxsplit=1)[0].split("::")[-1]
        if _GENERIC.search(base):
            functors = [f for f in _FUNCTOR.findall(full) if f not in _SKIP_FUNCTORS and f != base]
            template_args = re.findall(r"<\s*([A-Za-z_]\w*)", full)
            if functors:
                base = f"{base} [{functors[0]}]"
            elif template_args:
                base = f"{base} [{template_args[0]}]"
    else:
        base = full
    return base if len(base) <= max_len else base[: max_len - 1] + "…"
