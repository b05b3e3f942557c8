"""fd-iluvatar: the fd-core backend for Iluvatar CoreX GPUs; the hooks are in ``backend``."""
