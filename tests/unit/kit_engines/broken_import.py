"""A module that does not import (its own import fails)."""

import phoenix_hpc_no_such_module  # noqa: F401
