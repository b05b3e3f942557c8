"""fd-gcu: the fd-core backend for Enflame GCUs; the hooks are in ``backend``."""
