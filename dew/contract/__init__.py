"""The contract: what a run is, what its parts are called, and how its directory is laid out.

- ``config``: the typed run (``RunConfig`` and its parts), re-exported by the public ``dew.config``;
- ``typed``: strict conversion from JSON-like values to those dataclasses, with dotted-path errors;
- ``registry``: the one registry shape, and names every layer shares (dtypes, kernels);
- ``models``, ``objectives``, ``data``, ``schedules``: the registries of architectures, objectives,
  datasets and schedules, and the base class each registered part subclasses (the optimizers'
  registry is ``dew.training.optim.registry``: nothing in the contract names an optimizer's rule);
- ``axes``: the logical axis names the models and ``trainer.layout.rules`` share;
- ``rundir``: the run directory's format, which its writer (``dew.training``) and its readers
  (``dew.runs``, ``dew-sample``) share.

This package is a leaf: it imports nothing from dew outside it, and no JAX, so a config composes and
validates on a login node, in a launcher or in a test in milliseconds. The one arrow out of it is
the contract's own: ``RunConfig.train`` calls the trainer (tests/test_layers.py holds both rules).
"""
