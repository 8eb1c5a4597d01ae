"""Differentiation rules, one module per family. A rule is a forward plus one vjp per argument."""
