"""``python -m phoenix_hpc.demo [OPTIONS]``: the same as ``phoenix demo``."""

from phoenix_hpc.demo.cli import main

if __name__ == "__main__":
    main()
