"""Multi-objective tools: Pareto fronts and hypervolume (used by strategies, the MLflow
plugin's parent-run curve and the benchmarks)."""
