"""phoenix_hpc.drills: fault-injection requests sent to a running job and drills of many faults, followed to
their outcome (operator side; the rank side of injection is :mod:`phoenix_hpc.faults`)."""
