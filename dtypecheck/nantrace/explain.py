"""Turning a dtype-mismatch exception into an explanation: which tensor is the odd one, where it was made, and
the cast that fixes it."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from dtypecheck.nantrace.dtypeflow import Raised
from dtypecheck.nantrace.frames import location_of
from dtypecheck.nantrace.report import DtypeError, Location, TensorArg

_DTYPE_WORDS = re.compile(r"dtype|scalar type|datatype|Input type \(", re.IGNORECASE)
"""What torch's dtype-mismatch messages say (``mat1 and mat2 must have the same dtype``, ``expected scalar type
Float but found Double``, ``Input type (double) and bias type (float)``, ``mixed dtype (CPU)``)."""

_MODEL_METHOD = {"float64": "double", "float32": "float", "float16": "half", "bfloat16": "bfloat16"}
_INTEGER_ARGS = ("indices", "index", "target")


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(seen) < 8:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def is_dtype_error(exc: BaseException) -> bool:
    return isinstance(exc, RuntimeError | TypeError) and bool(_DTYPE_WORDS.search(str(exc)))


_LIBRARY_NAMES = frozenset({"torch", "F", "nn", "np", "numpy"})


def _calls_on_line(location: Location | None) -> list[ast.Call]:
    if location is None or not location.code:
        return []
    try:
        tree = ast.parse(location.code.removesuffix(":"))
    except SyntaxError:  # one line of a statement spanning several
        return []
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)]


def _module_call(record: Raised) -> ast.Call | None:
    """The call of the module on the line that called it: ``self.fc(x)`` for ``fc``; for the model itself (path
    ""), the one call on the line with as many positional arguments that is not a library function."""
    calls = _calls_on_line(location_of(record.frame))
    name = (record.module or "").rpartition(".")[2]
    for call in calls:
        callee = call.func
        called = callee.attr if isinstance(callee, ast.Attribute) else getattr(callee, "id", None)
        if name and called == name:
            return call
    if name:
        return None
    for call in calls:
        root = call.func
        while isinstance(root, ast.Attribute):
            root = root.value
        if getattr(root, "id", None) not in _LIBRARY_NAMES and len(call.args) == len(record.call_args):
            return call
    return None


def _call_site(modules: list[Raised], address: int) -> tuple[str | None, str | None, Location | None]:
    """(the user's expression for the odd input, the module as the user called it, that line): from the
    innermost module whose calling line can be read and whose call was given the odd tensor (``model(x)`` when
    the failing layer sits in a Sequential); else the innermost readable call."""
    fallback: tuple[str | None, str | None, Location | None] = (None, None, None)
    for record in modules:
        call = _module_call(record)
        if call is None:
            continue
        line = location_of(record.frame)
        written = ast.unparse(call.func)
        if address != -1 and address in record.call_args:
            position = record.call_args.index(address)
            if position < len(call.args):
                return ast.unparse(call.args[position]), written, line
        if fallback[1] is None:
            fallback = (None, written, line)
    return fallback


def _where(location: Location | None) -> str:
    return f"{Path(location.file).name}:{location.line}" if location is not None else "?"


def _float_fix(
    odd: TensorArg, expected: str, site: tuple[str | None, str | None, Location | None], module: str | None
) -> str:
    cast = f"torch.{expected}"
    if odd.parameter is not None:
        return f"convert `{odd.parameter}` with `.to({cast})` so that it matches the rest of the model"
    variable, callee, call_line = site
    subject = f"`{variable}`" if variable else f"the `{odd.name}` argument"
    expression = f"{variable}.to({cast})" if variable else f".to({cast})"
    before = f" before `{callee or module}`" if module else (f" before `{callee}`" if callee else "")
    if module == "" and not callee:
        before = " before the model"
    text = f"cast {subject} with `{expression}`{before}"
    if call_line is not None:
        text += f" (line {call_line.line})"
    if odd.created is not None:
        text += f", or where it is created ({_where(odd.created)})"
    if module is not None:
        method = _MODEL_METHOD.get(odd.dtype)
        if method is not None:
            text += f"; or keep the model in {odd.dtype} with `model.{method}()`"
    return text


def explain(exc: BaseException, raised: list[Raised], dominant: str | None, traceback_text: str) -> DtypeError | None:
    """The explanation for ``exc``, when it is a dtype mismatch that tracing saw happen; else None."""
    chain = list(_chain(exc))
    if not any(is_dtype_error(e) for e in chain):
        return None
    by_op = next((r for r in raised if r.op is not None and any(r.exc is e for e in chain)), None)
    modules = [r for r in raised if r.op is None and any(r.exc is e for e in chain)]
    """Every module the exception left, innermost first."""
    primary = by_op or (modules[0] if modules else None)
    if primary is None:
        return None
    message = next(str(e) for e in chain if is_dtype_error(e))
    inputs = primary.inputs
    expected = primary.module_dtype or dominant
    location = location_of(primary.frame)
    odd: tuple[TensorArg, ...]
    fix: str
    if "mask" in message and "bool" in message.lower():
        odd = tuple(a for a in inputs if "mask" in a.name and a.dtype != "bool")
        expected = "bool"
        fix = "; ".join(f"make `{a.name}` boolean with `.bool()`" for a in odd) or "use a boolean mask (`.bool()`)"
    elif "Long" in message and any(a.name in _INTEGER_ARGS for a in inputs):
        odd = tuple(a for a in inputs if a.name in _INTEGER_ARGS and a.dtype not in ("int64", "int32"))
        expected = "int64"
        fix = "; ".join(f"cast `{a.name}` to integers with `.long()`" for a in odd) or "pass int64 indices (`.long()`)"
    else:
        floats = [a for a in inputs if a.dtype.startswith(("float", "bfloat"))]
        if expected is None and floats:
            expected = max({a.dtype for a in floats}, key=lambda d: sum(a.dtype == d for a in floats))
        odd = tuple(a for a in floats if a.dtype != expected)
        if odd and expected is not None:
            first = next((a for a in odd if a.parameter is None), odd[0])
            site = _call_site(modules, primary.addresses[inputs.index(first)])
            fix = _float_fix(first, expected, site, primary.module)
        else:
            fix = "give every floating input the same dtype (`.to(...)`)"
    return DtypeError(
        exception=f"{type(chain[0]).__name__}: {chain[0]}",
        op=primary.op,
        module=primary.module,
        module_type=primary.module_type,
        location=location,
        inputs=inputs,
        expected=expected,
        odd=tuple(a.name for a in odd),
        fix=fix,
        traceback=traceback_text,
    )


def _shape(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(n) for n in shape) + ("," if len(shape) == 1 else "") + ")"


def explanation_text(error: DtypeError) -> str:
    """The plain-text explanation written to stderr before the ``error:`` line."""
    where = f" in module {error.module or '(model)'}" if error.module is not None else ""
    if error.module_type:
        where += f" ({error.module_type})"
    lines = [f"dtype mismatch{f' in {error.op}' if error.op else ''}{where} at {_where(error.location)}"]
    if error.location is not None and error.location.code:
        lines.append(f"    {error.location.code}")
    rows = [(arg.name, arg.dtype, _shape(arg.shape), arg.parameter or "") for arg in error.inputs]
    widths = [max((len(row[i]) for row in rows), default=0) for i in range(4)]
    for arg, row in zip(error.inputs, rows, strict=True):
        text = "  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        if arg.created is not None:
            text += f"  created at {_where(arg.created)} by {arg.created_by}"
        if arg.name in error.odd:
            text += "  <- the odd one"
        lines.append(text.rstrip())
    if error.expected is not None:
        lines.append(f"  expected {error.expected}")
    lines.append(f"  fix: {error.fix}")
    return "\n".join(lines) + "\n"
