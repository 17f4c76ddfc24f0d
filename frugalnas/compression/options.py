"""The named choices of a compression, importable without torch (the command line lists
them before anything heavy is loaded)."""

#: How the parts of a parent are ranked (:mod:`frugalnas.compression.importance`).
IMPORTANCE_METHODS = ("activation", "gradient")
#: What the child is fine-tuned on (:mod:`frugalnas.compression.distill`).
DISTILL_LOSSES = ("distill", "next-token")
