"""How ``--help`` reads at any terminal width: typer's rich help, with two of its habits corrected.

* A value list written ``a|b|c`` is one word to rich, cut with "…" where the help column is
  narrower than it (80 columns cut ``--attention``'s and ``--pooling``'s). ``one_of`` joins the
  values of a vocabulary (``attn_export.vocab``, the registries) with " | ", so the list wraps
  like prose and every value the option accepts stays readable.
* typer's rich help prints a flag's value type after it (``--help <bool>``), where click's own
  help leaves it out (``Option.get_help_record``: ``if not self.is_flag``). Our flags say
  ``metavar=""``; ``App`` gives the help option of every command it makes the same. A subclass
  rather than a patch of typer's module: nothing outside this CLI changes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup

__all__ = ["App", "one_of"]


def one_of(values: Iterable[str], notes: Mapping[str, str] | None = None) -> str:
    """``values`` as help text, ``a (note) | b | c``: each value once, in order, with its note where one is given."""
    notes = notes or {}
    return " | ".join(f"{v} ({notes[v]})" if v in notes else v for v in dict.fromkeys(values))


def _without_type(option: Any) -> Any:
    if option is not None:
        option.metavar = ""  # a flag takes no value: nothing to show after --help
    return option


class _Group(TyperGroup):
    def get_help_option(self, ctx: Any) -> Any:
        return _without_type(super().get_help_option(ctx))


class _Command(TyperCommand):
    def get_help_option(self, ctx: Any) -> Any:
        return _without_type(super().get_help_option(ctx))


class App(typer.Typer):
    """``typer.Typer`` whose group and commands show ``--help`` without a value type."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cls=_Group, **kwargs)

    def command(self, *args: Any, cls: type[TyperCommand] | None = None, **kwargs: Any) -> Any:  # type: ignore[override]
        return super().command(*args, cls=cls or _Command, **kwargs)
