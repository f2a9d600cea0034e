"""The command mains, and nothing else: ``dew-train`` (Hydra), ``dew-recipe`` (tyro), ``dew-plan``,
``dew-runs``, ``dew-eval``, ``dew-sample`` and ``dew-export``. Each parses its command line and hands
it to the packages below (``dew.commandline``, ``dew.inference``, ``dew.launching``,
``dew.training``); no module outside this package imports it (tests/test_layers.py)."""
