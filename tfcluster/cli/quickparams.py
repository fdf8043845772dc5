"""Command-line values converted without pydantic, so that a command starts at once.

Typer converts every value of the command it runs with a pydantic TypeAdapter, built on first use: importing
pydantic and building the adapters of one command costs more (about 130 ms) than the rest of `tfcluster status`
together. The values this CLI takes are strings, paths, lists of strings and bounded numbers written in digits;
those are converted here, exactly as typer would. Anything else, and every value these rules do not accept
(a number out of range, `1e3`, a string that is not valid Unicode), goes to typer's own adapter, so a bad value
is refused with typer's message, and a kind of value this module does not know still works, only slower.

Typer has no public hook for this: `install` replaces the method that builds typer's per-parameter converter
(lazily, on a parameter's first value), and leaves typer as it is where its internals are not what it expects.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, get_args, get_origin

_INT = re.compile(r"[0-9]{1,18}")
_FLOAT = re.compile(r"[0-9]{1,15}(\.[0-9]{1,15})?")
_NOT_CONVERTED = object()
_typer: Any = None  # typer's own path checks (typer._param_types), once install() found them


def _text(value: Any) -> Any:
    if isinstance(value, str):
        try:
            value.encode()  # a lone surrogate (undecodable argv bytes): typer's adapter decides
        except UnicodeEncodeError:
            return _NOT_CONVERTED
        return value
    return _NOT_CONVERTED


def _number(kind: type, info: Any, value: Any) -> Any:
    if info.clamp or not isinstance(value, str) or not (_INT if kind is int else _FLOAT).fullmatch(value):
        return _NOT_CONVERTED
    number = kind(value)
    if (info.min is not None and number < info.min) or (info.max is not None and number > info.max):
        return _NOT_CONVERTED  # typer says what range it wanted
    return number


def _leaf(annotation: Any, info: Any, value: Any, param: Any, ctx: Any) -> Any:
    """One value of a known kind, converted; _NOT_CONVERTED for the rest."""
    if info.parser is not None:
        return _NOT_CONVERTED
    if annotation is str:
        return _text(value)
    if annotation in (int, float):
        return _number(annotation, info, value)
    if annotation is Path and _typer.routes_to_path(annotation, info) and info.path_type is None:
        if _text(value) is _NOT_CONVERTED or value == "":
            return _NOT_CONVERTED
        # Given a Path already, typer's own check (exists, file or dir, readable...) needs no adapter.
        return _typer.coerce_cli_path(Path(value), info, path_type=Path, param=param, ctx=ctx)
    return _NOT_CONVERTED


class QuickConversion:
    """What typer's runtime converter does for one parameter, for the kinds of value above; typer's own
    converter, built only when needed, for the rest."""

    def __init__(self, param: Any):
        self.param = param
        self.slow = None

    def coerce(self, value: Any, param: Any, ctx: Any) -> Any:
        many = param.multiple or param.nargs == -1
        if value is None:  # an absent value (typer's rule: no adapter involved)
            return () if many else None
        converted = self._quick(value, param, ctx, many)
        if converted is not _NOT_CONVERTED:
            return converted
        if self.slow is None:
            from typer._coercion import build_runtime_param  # pydantic comes with it

            self.slow = build_runtime_param(self.param.type_descriptor)
        return self.slow.coerce(value, param=param, ctx=ctx)

    def _quick(self, value: Any, param: Any, ctx: Any, many: bool) -> Any:
        descriptor = param.type_descriptor
        annotation, info = descriptor.annotation, descriptor.parameter_info
        if descriptor.file_annotation is not None:
            return _NOT_CONVERTED
        if get_origin(annotation) is list:
            if not many or not isinstance(value, (list, tuple)):
                return _NOT_CONVERTED
            items = [_leaf(get_args(annotation)[0], info, item, param, ctx) for item in value]
            return _NOT_CONVERTED if any(item is _NOT_CONVERTED for item in items) else items
        if many:
            return _NOT_CONVERTED
        return _leaf(annotation, info, value, param, ctx)


def install() -> None:
    """Every typer parameter of this process converts its values as above (the CLI's process: the daemons'
    commands too, which convert their flags once)."""
    global _typer
    try:
        from typer import _param_types
        from typer.core import _TyperParameter
    except ImportError:  # typer's internals changed: typer converts, slower
        return
    if not hasattr(_TyperParameter, "get_runtime_param"):
        return
    _typer = _param_types

    def get_runtime_param(param: Any) -> Any:
        if getattr(param, "_runtime_param", None) is None:
            param._runtime_param = QuickConversion(param)
        return param._runtime_param

    _TyperParameter.get_runtime_param = get_runtime_param
