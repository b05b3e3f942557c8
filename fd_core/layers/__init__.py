"""Model building blocks that call kernels through a backend's ``ops``.

Owns parameters (``Param``: a shaped slot the loader fills) and the layers
models are assembled from (linear, norm, attention, gated MLP, MoE). Layers
hold paddle tensors and never branch on the device. May import:
fd_core.ops, fd_core._paddle, fd_core.backends (types only).
"""
