"""Built-in plugin: MLflow tracking (placeholder replaced below)."""
