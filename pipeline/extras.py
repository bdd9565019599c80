"""Optional extras (pyproject ``[project.optional-dependencies]``): checked before any work, named
with the install command that works from a checkout (shardsmith is not on a package index, so
``pip install shardsmith[dask]`` cannot)."""

from __future__ import annotations

import importlib.util

from pipeline.errors import ShardsmithError

# importable module -> (extra that installs it, package name, what needs it); a modality adds its
# own
EXTRAS: dict[str, tuple[str, str, str]] = {
    "distributed": ("dask", "dask[distributed]", "--backend dask"),
    "ray": ("ray", "ray", "--backend ray"),
    "lightning": ("lightning", "lightning", "the Lightning DataModule"),
}


def register_extra(module: str, extra: str, package: str, what: str) -> None:
    """Declare that ``what`` needs ``module``, installed by the pyproject extra ``extra``
    (``package``)."""
    EXTRAS[module] = (extra, package, what)


BACKEND_MODULES = {"dask": "distributed", "ray": "ray"}


class MissingExtraError(ShardsmithError):
    """An optional package is not installed; the message says which extra installs it."""


def install_command(extra: str) -> str:
    return f'pip install -e ".[{extra}]"'


def require(module: str) -> None:
    """Raise MissingExtraError, naming the install command, when ``module`` cannot be imported."""
    extra, package, what = EXTRAS[module]
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise MissingExtraError(
            f"{what} needs the optional package {package}, which is not installed: "
            f"{install_command(extra)} (run in the shardsmith checkout)"
        )


def require_backend(backend: str) -> None:
    """The build backend's optional package, checked before the build writes anything."""
    if backend in BACKEND_MODULES:
        require(BACKEND_MODULES[backend])
