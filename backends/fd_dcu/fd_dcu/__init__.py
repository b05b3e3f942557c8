"""fd-dcu: the fd-core backend for Hygon DCUs; the hooks are in ``backend``."""
