"""optcore's wrappers: see docs/development.md's map."""
