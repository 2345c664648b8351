"""``phoenix demo`` (the command: :mod:`phoenix_hpc.cli.demo`; also ``scripts/demo.sh``): the main job end
to end on the local Slurm cluster -- a fault-free reference run, the same run with a node killed mid-run and
hot-swapped to a spare, and a report comparing the two (:mod:`.run`, :mod:`.report`)."""
