"""Built-in plugin (to be filled in)."""
