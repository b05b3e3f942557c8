"""fd-xpu: the fd-core backend for Kunlunxin XPUs; the hooks are in ``backend``."""
