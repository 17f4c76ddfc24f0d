"""The version of frugalnas (one place, so no subpackage imports the root package for it)."""

__version__ = "0.1.0"
