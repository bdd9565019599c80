"""loaders/engine."""
