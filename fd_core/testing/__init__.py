"""Testing support: generated checkpoints, and the conformance suite a backend runs against the CPU oracle."""
