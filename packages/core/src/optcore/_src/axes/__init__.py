"""optcore's axes: see docs/development.md's map."""
