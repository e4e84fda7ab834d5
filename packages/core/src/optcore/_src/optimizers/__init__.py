"""optcore's optimizers: see docs/development.md's map."""
