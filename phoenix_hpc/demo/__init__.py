"""``phoenix demo`` (also ``python -m phoenix_hpc.demo`` and ``scripts/demo.sh``): the main job end to end on
the local Slurm cluster -- a fault-free reference run, the same run with a node killed mid-run and hot-swapped
to a spare, and a report comparing the two (:mod:`.run`, :mod:`.report`)."""
