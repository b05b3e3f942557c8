"""The backend listing and selection with the hardware backends installed."""
