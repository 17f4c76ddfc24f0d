"""Building blocks shared by spaces and by weight sharing, owned by no space: the weight
store (:mod:`.weight_store`) and the batch norm of shared weights (:mod:`.shared_bn`)."""
