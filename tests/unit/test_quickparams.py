"""The CLI's quick value conversion gives what typer's own (pydantic) conversion gives, for every parameter of
every command, and leaves every value it does not accept (a bad one included) to typer."""

from __future__ import annotations

import pytest
import typer.main
from typer._coercion import build_runtime_param
from typer._click.exceptions import BadParameter

from tfcluster.cli import load_commands, quickparams

SAMPLES = [None, (), ("a", "b c"), "", "x", "0", "7", "12", "-1", "+3", " 5", "1e3", "0.25", "2147483648", "30s",
           "/nonexistent/dir", "/", "\udcff"]


def every_parameter():
    app = load_commands([])  # every command's module

    def walk(command, path):
        for param in getattr(command, "params", ()):
            if hasattr(param, "type_descriptor"):
                yield f"{path}:{param.name}", param
        for name, sub in getattr(command, "commands", {}).items():
            yield from walk(sub, f"{path} {name}")
    return list(walk(typer.main.get_command(app), "tfcluster"))


def converted(conversion, value, param):
    try:
        return ("ok", conversion.coerce(value, param=param, ctx=None))
    except BadParameter as e:
        return ("refused", e.format_message())
    except (TypeError, ValueError, AssertionError) as e:
        return ("error", type(e).__name__)


@pytest.mark.parametrize("name,param", every_parameter(), ids=lambda v: v if isinstance(v, str) else "")
def test_quick_conversion_is_typers(name, param):
    if param.type_descriptor.annotation is bool:
        pytest.skip("flags are booleans already: typer converts nothing")
    for value in SAMPLES:
        want = converted(build_runtime_param(param.type_descriptor), value, param)
        assert converted(quickparams.QuickConversion(param), value, param) == want, (name, value)


def test_a_bad_value_gets_typers_message():
    param = dict(every_parameter())["tfcluster logs:tail"]
    kind, message = converted(quickparams.QuickConversion(param), "-1", param)
    assert kind == "refused" and "greater than or equal to 0" in message
