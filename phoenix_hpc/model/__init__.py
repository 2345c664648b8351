"""Cost model of faults for checkpoint-restart and PHOENIX.

- :mod:`~phoenix_hpc.model.analytic`: closed-form disruption per fault, efficiency and replica-loss bound
  (paper Eqs. 1-6).
- :mod:`~phoenix_hpc.model.montecarlo`: whole training campaigns under random faults, many trials, means with
  95 % confidence intervals.
- :mod:`~phoenix_hpc.model.spares`: node failures as a Poisson process, spares needed, and the hot swap /
  shrink / stop rules when spares run out.
- :mod:`~phoenix_hpc.model.fit`: recovery time against cluster size, law selection and extrapolation.
- :mod:`~phoenix_hpc.model.dist`, :mod:`~phoenix_hpc.model.journal`: per-fault cost distributions and
  measured recoveries from a run journal; :mod:`~phoenix_hpc.model.plots`: PNG figures.
"""
