"""Inference on a finished run: its record with the command line's overrides (``composing``), the run
rebuilt and its parameters restored (``restore``), evaluated (``evaluating``: dew-eval), drawn from
(``drawing``: dew-sample) and written in another layout (``exporting``: dew-export). Below the
commands (``dew.cli``), above the engine (``dew.training``) whose builders and checkpoints it reads."""
