"""Registered datasets. This package file and ``specs`` do not import JAX or grain; each spec's
``load`` imports its pipeline when a run is built."""

from dew.data.specs import DataSpec, datasets

__all__ = ["DataSpec", "datasets"]
