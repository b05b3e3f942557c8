"""fd-cuda: the fd-core backend for NVIDIA GPUs; the hooks are in ``backend``."""
