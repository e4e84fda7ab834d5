"""optcore's ground: see docs/development.md's map."""
