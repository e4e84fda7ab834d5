"""optcore's persistence: see docs/development.md's map."""
