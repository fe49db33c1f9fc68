"""Option values converted without pydantic: typer 0.29 hands every option value that is not a bool flag to a
pydantic ``TypeAdapter``, and importing pydantic and building the adapters cost a command 0.15-0.25 s of CPU before it
reads a byte (``python -X importtime -m kvconv validate DUMP``: ``typer._adapters`` 244 ms cumulative of a 0.87 s
process on a loaded 2-core machine). kvconv's options are ``str``, ``int``, ``float``, ``Path`` and lists of them;
they are converted here as click converts them, and a path goes through typer's own checks
(``coerce_cli_path``: exists, file or folder, readable) once it is a ``Path``. Any other option (a parser of its own,
a choice, a range, a file) keeps typer's conversion, and so does every option under a typer without this layer
(before 0.29: nothing to do).

    >>> import typer.main                                   # doctest: +SKIP
    >>> from kvconv.cli import app                          # doctest: +SKIP
    >>> plain_conversion(typer.main.get_command(app))      # doctest: +SKIP
"""

from __future__ import annotations

from pathlib import Path
from typing import get_args, get_origin

_SCALARS = {str: str, int: int, float: float}
_WORDS = {int: "integer", float: "float"}


def plain_conversion(group) -> None:
    """Give each parameter of ``group``'s commands (and of the group) that kvconv's own conversion handles a
    conversion without pydantic (module docstring); the others keep typer's."""
    try:
        from typer._coercion import RuntimeParam
    except ImportError:  # a typer without the pydantic layer: click converts the values itself
        return
    cls = _plain_class(RuntimeParam)
    for cmd in [group, *getattr(group, "commands", {}).values()]:
        for p in cmd.params:
            _give(p, cls)
        if not getattr(cmd.get_help_option, "plain", False):
            cmd.get_help_option = _help_option(cmd.get_help_option, cls)


def _give(p, cls) -> None:
    td = getattr(p, "type_descriptor", None)
    if getattr(p, "_runtime_param", "") is None and td is not None and _plain(td):
        p._runtime_param = cls(parameter_info=td.parameter_info, annotation=td.annotation)


def _help_option(get, cls):
    """The command's ``-h/--help`` (made when a context first asks for it) converted as the others."""

    def get_help_option(ctx):
        opt = get(ctx)
        if opt is not None:
            _give(opt, cls)
        return opt

    get_help_option.plain = True
    return get_help_option


def _plain(td) -> bool:
    """Whether kvconv converts this parameter itself: a str, int, float or Path (or a list of one), with no parser,
    choice, range or file of typer's."""
    pi = td.parameter_info
    if pi.parser is not None or td.file_annotation is not None or td.is_choice or td.is_ranged:
        return False
    t = td.annotation
    if get_origin(t) is list:
        (t,) = get_args(t)
    return t in _SCALARS or t is Path or t is bool


def _plain_class(base):
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class Plain(base):
        """A value converted as click converts it (typer's RuntimeParam: None and multiple values handled there)."""

        def _coerce_value(self, value, param, ctx):
            t = self.annotation
            if get_origin(t) is list:
                (t,) = get_args(t)
                return [self._one(t, v, param, ctx) for v in value]
            return self._one(t, value, param, ctx)

        def _one(self, t, value, param, ctx):
            from typer._click.exceptions import BadParameter

            if t is Path:
                from typer._param_types import coerce_cli_path

                path = value if isinstance(value, Path) else Path(value)
                return coerce_cli_path(path, self.parameter_info, path_type=Path, param=param, ctx=ctx)
            if t is bool:
                if isinstance(value, bool):
                    return value
                text = str(value).strip().lower()
                if text in ("1", "true", "t", "yes", "y", "on"):
                    return True
                if text in ("0", "false", "f", "no", "n", "off"):
                    return False
                raise BadParameter(f"{value!r} is not a valid boolean.", ctx=ctx, param=param)
            try:
                return _SCALARS[t](value)
            except (TypeError, ValueError):
                raise BadParameter(f"{value!r} is not a valid {_WORDS.get(t, t.__name__)}.", ctx=ctx,
                                   param=param) from None

    return Plain
