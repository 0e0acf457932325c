"""``--help`` that fits an 80-column terminal and reads like a command line.

Click's plain help (typer's ``rich_markup_mode=None``) keeps every default visible at 80 columns where
the boxed rich panels cut them and doubled the length; typer 0.29 labels values with Python types
(``<str>``, ``<list[str]>``, ``<float range>``) and required arguments as ``{INPUT}``, so each value
gets a plain name here instead (``PATH``, ``N``, ``NUMBER``), once, on the built click command.
"""

from __future__ import annotations

from typing import Any

# options whose value is a file or directory
PATH_OPTIONS = frozenset(
    {"output", "manifest", "shards", "html", "json_path", "critical_path", "out", "to", "output_dir"}
)
BY_TYPE = {str: "TEXT", int: "N", float: "NUMBER"}


def _value_name(param: Any) -> str:
    if param.name in PATH_OPTIONS:
        return "PATH"
    annotation = getattr(getattr(param, "type_descriptor", None), "annotation", str)
    element = getattr(annotation, "__args__", (annotation,))[0]
    return BY_TYPE.get(element, "TEXT")


def _argument(param: Any) -> None:
    name = param.metavar or param.name.upper()
    usage = (name if param.required else f"[{name}]") + ("..." if param.nargs != 1 else "")
    param.metavar = name
    # instance attributes shadow typer's methods: the help row shows the name only, the usage line
    # the name without braces
    param.display_type_rich = lambda ctx: None
    param._usage_display_name = lambda: usage


def tidy(command: Any) -> Any:
    """Give every value of ``command`` and its subcommands a plain name (see the module docstring)."""
    for sub in getattr(command, "commands", {}).values():
        tidy(sub)
    for param in getattr(command, "params", []):
        if param.param_type_name == "argument":
            _argument(param)
        elif not getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = _value_name(param)
    return command
