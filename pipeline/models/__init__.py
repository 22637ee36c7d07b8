"""Models: loading from local folders, the registry of real models, the tiny builders (and their weights)."""
