"""Reading runs from their files alone: which runs a directory holds, what state each is in, how they
differ and how they compare (``dew-runs``). Nothing here imports JAX, so listing a sweep takes a
fraction of a second; plotting imports matplotlib only when asked to."""
