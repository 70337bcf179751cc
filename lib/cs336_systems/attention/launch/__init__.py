"""How FlashAttention's kernels are launched: shape and stride facts (`layout`), launch plans and every cache
(`plans`), the Gluon launches (`gluon`), the route of a call and the Python host path (`dispatch`), the C++
autograd node that replays the same launches for eager CUDA calls (`native`, its source in `csrc/`)."""
