"""Site profiles: the :class:`SiteProfile` model and its loader for the top-level ``sites/*.yaml``."""

from phoenix_hpc.profiles.load import available_sites, find_profile, load_profile
from phoenix_hpc.profiles.model import SiteProfile

__all__ = ["SiteProfile", "available_sites", "find_profile", "load_profile"]
