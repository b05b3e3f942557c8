"""A third-party fd-core backend used by fd-core's own tests (``backend``)."""
