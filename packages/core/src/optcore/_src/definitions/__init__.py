"""optcore's definitions: see docs/development.md's map."""
