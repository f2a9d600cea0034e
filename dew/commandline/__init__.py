"""What every dew command and the launchers share: the exit statuses (``exits``), a console
script's start and end (``console``), dew's config in Hydra's ConfigStore (``configs``, ``schema``),
the one override parser (``overrides``, ``json_args``), Hydra's errors in one line
(``hydra_errors``) and the tyro command line of ``dew-recipe`` (``tyro_schema``).

Below the commands (``dew.cli``), the inference package (``dew.inference``) and the launchers
(``dew.launching``): of the launching package it imports only its leaves (``naming``,
``interrupts``, ``gc_settings``), never a launcher (tests/test_layers.py)."""
