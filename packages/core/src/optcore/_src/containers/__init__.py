"""optcore's containers: see docs/development.md's map."""
