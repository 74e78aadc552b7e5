"""A pydantic ``ValidationError`` as the one line a user reads: ``<file>: <field>: expected X, got Y; <fix>``.

``schema.validate`` raises it as the caller's error class; the field is named by path, list
items by their ``name`` where they have one (``stages[onnx-int8].accuracy.cosine``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

__all__ = ["one_line", "show"]


# --- errors ---------------------------------------------------------------------------------------
_EXPECTED_BY_TYPE = {
    "float_type": "a number", "float_parsing": "a number", "int_type": "an integer", "int_parsing": "an integer",
    "int_from_float": "an integer", "bool_type": "true or false", "bool_parsing": "true or false",
    "string_type": "a string", "list_type": "a list", "dict_type": "an object", "model_type": "an object",
    "model_attributes_type": "an object", "finite_number": "a finite number", "missing": "a value",
    "extra_forbidden": "no such key",
}  # fmt: skip


def show(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, float):
        return repr(value)
    text = json.dumps(value, default=str, allow_nan=True)
    return text if len(text) <= 60 else text[:57] + "..."


def _expected_text(err: Mapping[str, Any]) -> str:
    kind, ctx = err["type"], err.get("ctx") or {}
    if kind == "expected":
        return str(ctx.get("what", err["msg"]))
    if kind == "literal_error":
        return f"one of {ctx.get('expected')}"
    bounds = {
        "greater_than": "> {gt}",
        "greater_than_equal": ">= {ge}",
        "less_than": "< {lt}",
        "less_than_equal": "<= {le}",
    }
    if kind in bounds:
        return "a value " + bounds[kind].format(**ctx)
    if kind in ("too_short", "too_long", "string_too_short", "string_too_long"):
        n = ctx.get("min_length", ctx.get("max_length"))
        unit = "character" if kind.startswith("string") else "entry" if isinstance(err.get("input"), dict) else "item"
        plural = {"entry": "entries", "item": "items", "character": "characters"}[unit] if n != 1 else unit
        return f"{'at least' if 'short' in kind else 'at most'} {n} {plural}"
    if kind == "string_pattern_mismatch":
        return f"a name matching {ctx.get('pattern')}"
    return _EXPECTED_BY_TYPE.get(kind, str(err["msg"])[:1].lower() + str(err["msg"])[1:])


def _field(loc: Sequence[Any], data: Any) -> str:
    """``stages[onnx-int8].accuracy.cosine``: list items named by their ``name`` when they have one."""
    out, node = "", data
    is_key = "[key]" in loc
    if is_key:  # a bad dict key: name the dict, the key is what is shown as "got"
        loc = loc[: loc.index("[key]") - 1]
    for part in loc:
        if isinstance(part, int):
            item = node[part] if isinstance(node, list) and 0 <= part < len(node) else None
            label = (
                item["name"] if isinstance(item, dict) and isinstance(item.get("name"), str) and item["name"] else part
            )
            out += f"[{label}]"
            node = item
        else:
            out += f".{part}" if out else str(part)
            node = node.get(part) if isinstance(node, dict) else None
    return (out or "(top level)") + (" key" if is_key else "")


def one_line(source: str, err: ValidationError, data: Any, fix: str) -> str:
    errors = err.errors(include_url=False)
    first = errors[0]
    ctx = first.get("ctx") or {}
    got = "nothing (the key is missing)" if first["type"] == "missing" else ctx.get("got") or show(first.get("input"))
    more = f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})" if len(errors) > 1 else ""
    line = f"{source}: {_field(first['loc'], data)}: expected {_expected_text(first)}, got {got}{more}; {fix}"
    return " ".join(line.split())
