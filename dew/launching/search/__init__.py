"""dew's hyperparameter search (``hydra/sweeper=optuna``, docs/search.md): the sweeper and its
study (``study_sweeper``), its config in Hydra's ConfigStore (``sweeper_conf``), its search space
(``search_space``), the worker jobs that run a study's trials under SLURM (``study_workers``), a
trial's pruning (``pruning``), how a trial ends in the study (``study_outcome``) and what a trial's
process knows of its search (``trial``). Hydra finds the sweeper through
``hydra_plugins.dew_sweepers``."""
