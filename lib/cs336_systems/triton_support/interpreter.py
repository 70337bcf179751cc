"""Triton's CPU interpreter (TRITON_INTERPRET=1, set before triton is first imported): whether it built a
kernel, and two repairs our kernels need from it. Every kernel family of the library (attention, the
fused loss, the fused AdamW) asks here, so the repair is made once, whichever is imported first.
"""

from __future__ import annotations


class NeedsTritonInterpreter(ValueError):
    """CPU tensors handed to Triton kernels in a process where they were compiled for a GPU (TRITON_INTERPRET=1
    was not set before triton's first import): the work cannot run here. One type for every kernel family, so
    a caller (a test session on a GPU machine) can tell this from a wrong input."""


def built_by_interpreter(kernel) -> bool:
    """True when `kernel` (a @triton.jit function) was built by the interpreter, i.e. runs on CPU tensors."""
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(kernel, InterpretedFunction)


def repair_interpreter() -> None:
    """Work around two defects of the Triton 3.6 interpreter (CPU only) that our kernels hit (idempotent).

    1. It holds a scalar as a 1-element array and makes a loop bound of it with int(array),
       which NumPy >= 2.4 refuses; our loops run to runtime bounds (N_KEYS, the causal stop).
    2. Its tl.dot multiplies bfloat16 operands as their raw 16-bit patterns (NumPy has no
       bfloat16); widening them to float32 first gives the product the GPU computes.
    """
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    if getattr(interpreter, "_cs336_repaired", False):
        return
    patch_tensor = interpreter._patch_lang_tensor

    def patch_lang_tensor(tensor, scope):
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    create_dot = interpreter.InterpreterBuilder.create_dot

    def widen(h):
        if h.dtype == tl.bfloat16 and h.data.dtype == np.uint16:
            return interpreter.TensorHandle((h.data.astype(np.uint32) << 16).view(np.float32), tl.float32)
        return h

    def create_dot_widened(self, a, b, d, input_precision, max_num_imprecise_acc):
        return create_dot(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    interpreter._patch_lang_tensor = patch_lang_tensor
    interpreter.InterpreterBuilder.create_dot = create_dot_widened
    interpreter._cs336_repaired = True
