"""Finding and loading site profiles, by name (``perlmutter``) or by path (``./my-site.yaml``).

Names are looked up as ``<name>.yaml`` in the folders of ``$PHOENIX_SITE_PATH`` (``:``-separated, searched
first) and then the project's top-level ``sites/`` folder, so a user adds a site by dropping a file there or
passing its path; no code changes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from pydantic import ValidationError

from phoenix_hpc.validation import format_validation_error, read_yaml
from phoenix_hpc.errors import ProfileError
from phoenix_hpc.profiles.model import SiteProfile

BUILTIN_SITES_DIR = Path(__file__).resolve().parents[2] / "sites"


def site_dirs(environ: Mapping[str, str] | None = None) -> list[Path]:
    """Folders searched for ``<name>.yaml``, in order: ``$PHOENIX_SITE_PATH`` entries, then ``sites/``."""
    env = os.environ if environ is None else environ
    extra = [Path(p) for p in env.get("PHOENIX_SITE_PATH", "").split(":") if p]
    return [*extra, BUILTIN_SITES_DIR]


def available_sites(environ: Mapping[str, str] | None = None) -> list[str]:
    """Names of all profiles found in :func:`site_dirs`, sorted."""
    names: set[str] = set()
    for d in site_dirs(environ):
        if d.is_dir():
            names.update(p.stem for p in d.glob("*.yaml"))
    return sorted(names)


def _looks_like_path(site: str) -> bool:
    return "/" in site or site.endswith((".yaml", ".yml")) or site.startswith(".")


def find_profile(site: str, environ: Mapping[str, str] | None = None) -> Path:
    """The file of profile ``site`` (a name or a path).

    Raises:
        ProfileError: no such file / no profile of that name (the message lists the known names).
    """
    if _looks_like_path(site):
        p = Path(site)
        if not p.exists():
            raise ProfileError(f"site: profile file {site!r} does not exist")
        return p  # a directory or an unreadable file is refused, with the reason, when it is read
    for d in site_dirs(environ):
        p = d / f"{site}.yaml"
        if p.is_file():
            return p
    known = ", ".join(available_sites(environ)) or "(none)"
    raise ProfileError(f"site: unknown site {site!r}; known sites: {known} (or pass a path to a profile file)")


def load_profile(site: str, environ: Mapping[str, str] | None = None) -> SiteProfile:
    """Load and validate the site profile ``site`` (name or path).

    Raises:
        ProfileError: unknown site, unreadable file, bad YAML, unknown/missing fields, wrong types; every
            problem is listed with its field.
    """
    path = find_profile(site, environ)
    data = read_yaml(path, "site profile", error=ProfileError)
    data.setdefault("name", path.stem)
    try:
        return SiteProfile.model_validate(data)
    except ValidationError as exc:
        raise ProfileError(format_validation_error(exc), source=str(path)) from None
