"""Where grpo-launch keeps a user's files between runs: in XDG's directories (~/.cache and ~/.config by default),
under grpo-launch/, each place overridable by a variable of its own."""

from __future__ import annotations

import os
from pathlib import Path

XDG_CACHE_HOME = "XDG_CACHE_HOME"
XDG_CONFIG_HOME = "XDG_CONFIG_HOME"


def _xdg(variable: str, default: str) -> Path:
    return Path(os.environ.get(variable) or Path.home() / default) / "grpo-launch"


def cache_dir(name: str, variable: str) -> Path:
    """`$variable` if set, else `$XDG_CACHE_HOME/grpo-launch/<name>` (~/.cache without XDG)."""
    explicit = os.environ.get(variable)
    return Path(explicit) if explicit else _xdg(XDG_CACHE_HOME, ".cache") / name


def config_dir(name: str) -> Path:
    """`$XDG_CONFIG_HOME/grpo-launch/<name>` (~/.config without XDG)."""
    return _xdg(XDG_CONFIG_HOME, ".config") / name
