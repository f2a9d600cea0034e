"""Registered datasets: dew's dataset specs (``specs``) and their pipelines. This package file and
``specs`` do not import JAX or grain; each spec's ``load`` imports its pipeline when a run is built.
The dataset contract and its registry are ``dew.contract.data``."""
