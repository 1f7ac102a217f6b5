"""Everything of the GPU serving stack that is not a cloud resource."""
