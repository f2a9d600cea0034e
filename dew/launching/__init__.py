"""Launching: everything between a ``dew-train`` command and the processes that train, in one place.

- ``pool``: joining the JAX process pool (``trainer.multi_host``), process 0's answer on every
  process, a barrier, free coordinator ports for local jobs.
- ``slurm``: where a process stands in a SLURM job, and which of its node's GPUs are its own.
- ``naming``: a sweep's directory and its jobs' directories, and the sweep record that carries them
  from the launching process to every job.
- ``jobs``: a sweep's jobs as the launching process composes them, and how each one ended.
- ``checks``: what is checked before anything is queued (every job's config; a launcher chosen
  without ``-m``).
- ``sweep_lock``: a sweep whose jobs are alive is not started twice.
- ``launchers``: what every dew launcher does with a sweep's job list (the mixins the Hydra
  launcher classes of ``hydra_plugins/dew_launchers`` are made of), ``local_launcher`` and
  ``slurm_launcher`` what each submitit launcher adds.
- ``stop_exit``: how a process leaves after its run stopped on a signal (submitit's requeue, or
  128 + the signal).
- ``gc_settings``: the garbage collector of a dew program's own process (a command, a job's task).
- ``search``: the Optuna sweeper (``hydra/sweeper=optuna``), its study, its workers and a trial's
  pruning.

Nothing here imports JAX at module level: Hydra imports the launcher plugins at every start.
"""
