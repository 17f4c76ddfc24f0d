"""What the transformer-stack spaces (``gpt``, ``vit``) share: network-wide decisions, then per
layer the heads and MLP ratio, conditional on the depth (:mod:`.space`), and their structure
encoding for surrogates (:mod:`.encodings`)."""
