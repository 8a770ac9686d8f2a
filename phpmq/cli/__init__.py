"""The `phpmq` command line: a thin shell over the public API."""

from .main import main

__all__ = ["main"]
