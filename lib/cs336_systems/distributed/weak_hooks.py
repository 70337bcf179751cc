"""Hooks that hold the wrapper they call back into weakly.

A wrapper that registers a bound method of itself as a hook on the parameters it owns makes a
cycle through a tensor (parameter -> hook -> wrapper -> module -> parameter). Python's collector
does not traverse a tensor that C++ also holds (autograd's AccumulateGrad node does), so such a
cycle is never freed: every model wrapped and dropped in a long-lived process stays on the GPU, and
each run of a benchmark leaves its parameters allocated for the runs after it
(docs/measurements_record.md). A weak reference breaks the cycle; a hook whose wrapper is gone does nothing.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable


def weak_method(method: Callable) -> Callable:
    """`method` (a bound method) as a plain function that calls it while its object lives, else returns None."""
    ref = weakref.WeakMethod(method)

    def hook(*args, **kwargs):
        bound = ref()
        return None if bound is None else bound(*args, **kwargs)

    return hook
