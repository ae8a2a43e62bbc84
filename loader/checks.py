"""Checks of the loader's arguments, made when a dataset is built: a typo fails there, naming the choices."""

from __future__ import annotations

from .errors import ConfigError

__all__ = ["check_choice"]


def check_choice(name: str, value: object, allowed: tuple[str, ...]) -> None:
    """Raise ConfigError naming ``name``, ``value`` and the allowed values unless ``value`` is one."""
    if value not in allowed:
        raise ConfigError(f"unknown {name} {value!r}; expected one of {list(allowed)}")
