"""optcore's legacy: see docs/development.md's map."""
