"""The FlashAttention kernels, one module per kernel family, each opening with its math: the Triton forward
and backward (`triton_forward`, `triton_backward`, their tile loads in `triton_tiles`) and the Gluon
kernels for Hopper (`gluon_forward`, `gluon_backward` at d = 64, `gluon_backward_d128`, their CTA order in
`gluon_schedule`). Leaves: they import Triton and each other's helpers, nothing above them."""
