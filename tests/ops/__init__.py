"""Each CPU reference op against an independent numpy definition (numpy_ref)."""
