"""Kernel signatures and their reference implementations.

One module per kernel family. Each ``reference_*`` function is the
executable definition of its op in plain fp32 paddle ops: the built-in CPU
backend registers them, and every other backend is tested against them.
Hot-path ops handle the whole step's batch in one call (no Python loop over
requests or tokens). May import: fd_core._paddle (paddle, lazily), fd_core.backends (types), numpy.
Nothing here imports paddle at package import time.
"""
