"""fd-x86: the fd-core backend for x86 CPUs.

Owns: ``backend`` (the hooks), ``cpu`` (CPU feature detection and kernel
choice, no paddle), ``build`` (building and loading the C++ ops, cached),
``linear`` (calling them on ``QuantizedWeight``s) and ``csrc/`` (the
kernels). Imports fd_core; paddle only inside ``build`` and ``linear``.
"""
