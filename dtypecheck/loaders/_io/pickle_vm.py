"""A pickle virtual machine that never runs code: it interprets the opcode stream and builds inert data.

``pickle.load`` calls whatever callable the stream names (``os.system`` included). This machine instead turns
every ``GLOBAL``/``STACK_GLOBAL`` into an inert ``GlobalRef`` and every call (``REDUCE``, ``NEWOBJ``, ``INST``,
``OBJ``) into whatever the caller's ``call`` hook returns, by default an inert ``PickleObject`` that keeps its
arguments and ``BUILD`` state so tensors nested inside unknown objects are still found. Nothing is imported.

Memory stays proportional to the pickle's length: no opcode creates more than one object, and the caps below
turn a hostile stream into an ``InputError`` instead of a hang or a crash.
"""

from __future__ import annotations

import _compat_pickle
import io
import pickletools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dtypecheck.errors import InputError

MAX_MARK_DEPTH = 100_000
"""Deepest ``MARK`` nesting accepted; real checkpoints nest a few dozen levels."""
MAX_OPERATIONS = 30_000_000
"""Most opcodes one pickle may run (each builds at most one object): about a million tensors' worth. A hostile
stream of one-byte opcodes would otherwise cost ~60 bytes of Python objects per byte of file."""
MAX_KEY_TUPLE_DEPTH = 16
"""Tuples used as dict keys deeper than this are keyed by identity: hashing a deep tuple recurses in C."""


class PickleLimitError(InputError):
    """The stream stopped at one of this machine's own limits (or an opcode it refuses), not at a malformation: a
    real unpickler might go on, running what comes next."""


@dataclass(frozen=True)
class GlobalRef:
    """An inert reference to ``module.name``, standing where the real unpickler would import it."""

    module: str
    name: str
    called: bool = field(default=False, compare=False)
    """The stream calls it with arguments (``REDUCE``, ``NEWOBJ``/``NEWOBJ_EX``, ``INST``, ``OBJ``, or ``BUILD``
    of a state other than a plain ``__dict__``): ``pickle.load`` would run its code on the pickle's data. Not part
    of equality: a global is one global however it is used."""
    single_value: bool = field(default=False, compare=False)
    """Every call passes exactly one plain value (a str, a number): how an enum member is pickled."""

    @property
    def qualname(self) -> str:
        return f"{self.module}.{self.name}"

    def __str__(self) -> str:
        return self.qualname


@dataclass(eq=False)
class PickleObject:
    """An inert stand-in for an object the stream would have constructed by calling ``factory``."""

    factory: Any
    args: tuple[Any, ...] = ()
    kwargs: dict[Any, Any] | None = None
    state: Any = None
    dict_items: list[tuple[Any, Any]] = field(default_factory=list)
    list_items: list[Any] = field(default_factory=list)

    def __str__(self) -> str:
        return f"<{self.factory}>"


@dataclass(frozen=True, eq=False)
class IdentityKey:
    """A dict key the machine will not hash by value (a list, a dict, a deep tuple)."""

    value: Any

    def __str__(self) -> str:
        return f"<{type(self.value).__name__} key>"


CallHook = Callable[[Any, tuple[Any, ...], "dict[Any, Any] | None"], Any]
PersistentHook = Callable[[Any], Any]


def default_call(factory: Any, args: tuple[Any, ...], kwargs: dict[Any, Any] | None) -> Any:
    return PickleObject(factory, args, kwargs)


class _Mark:
    """The marker a ``MARK`` leaves; a distinct class so no data value can be mistaken for it."""


def _memo_key(arg: Any) -> int:
    if not isinstance(arg, int):
        raise TypeError(f"memo key {arg!r} is not an integer")
    return arg


def _safe_key(key: Any) -> Any:
    if key is None or isinstance(key, str | int | float | bytes | GlobalRef | PickleObject | IdentityKey):
        return key
    if isinstance(key, tuple) and _shallow_hashable(key, MAX_KEY_TUPLE_DEPTH):
        return key
    return IdentityKey(key)


def _shallow_hashable(value: tuple[Any, ...], depth: int) -> bool:
    if depth <= 0:
        return False
    for item in value:
        if isinstance(item, tuple):
            if not _shallow_hashable(item, depth - 1):
                return False
        elif not (item is None or isinstance(item, str | int | float | bytes | GlobalRef | PickleObject)):
            return False
    return True


class SafeUnpickler:
    """Interpret one pickle stream. ``globals_seen`` lists every global it references, in order, once each."""

    def __init__(
        self,
        data: bytes | io.RawIOBase,
        *,
        where: str,
        call: CallHook = default_call,
        persistent_load: PersistentHook | None = None,
    ) -> None:
        self.stream: io.RawIOBase | io.BytesIO = io.BytesIO(data) if isinstance(data, bytes) else data
        self.where = where
        self.call = call
        self.persistent_load = persistent_load
        self.globals_seen: list[GlobalRef] = []
        self._seen: set[GlobalRef] = set()
        self._index: dict[GlobalRef, int] = {}

    def _error(self, what: str) -> InputError:
        return InputError(f"{self.where}: malformed pickle ({what})")

    def _limit(self, what: str) -> PickleLimitError:
        return PickleLimitError(f"{self.where}: malformed pickle ({what})")

    def _global(self, module: Any, name: Any) -> GlobalRef:
        if not isinstance(module, str) or not isinstance(name, str):
            raise self._error("a global named by something other than strings")
        # Python 2 names, mapped as pickle's own fix_imports would (``__builtin__.eval`` is ``builtins.eval``).
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        elif module in _compat_pickle.IMPORT_MAPPING:
            module = _compat_pickle.IMPORT_MAPPING[module]
        ref = GlobalRef(module, name)
        if ref not in self._seen:
            self._seen.add(ref)
            self._index[ref] = len(self.globals_seen)
            self.globals_seen.append(ref)
        return ref

    def _called(self, factory: Any, args: tuple[Any, ...], kwargs: dict[Any, Any] | None = None) -> None:
        """Record that ``factory`` is called with ``args``: a global called with arguments runs its own code."""
        if isinstance(factory, GlobalRef) and factory.qualname in _REBUILD_HELPERS:
            cls = args[0] if args else None
            plain = _REBUILD_HELPERS[factory.qualname](args)
            if isinstance(cls, GlobalRef) and not plain:
                self._mark(cls, args[1:])
            return
        if isinstance(factory, GlobalRef) and (args or kwargs):
            self._mark(factory, args if not kwargs else (*args, kwargs))

    def _mark(self, ref: GlobalRef, args: tuple[Any, ...]) -> None:
        index = self._index.get(ref)
        if index is None:
            return
        before = self.globals_seen[index]
        single = len(args) == 1 and (args[0] is None or isinstance(args[0], str | int | float | bool))
        single = single and (before.single_value or not before.called)
        self.globals_seen[index] = GlobalRef(ref.module, ref.name, called=True, single_value=single)

    def load(self) -> Any:
        """Interpret the pickle that starts at the stream's current position."""
        try:
            return self._run(self.stream)
        except InputError:
            raise
        except RecursionError as exc:
            raise self._limit(f"{type(exc).__name__}: {exc}") from None
        except (ValueError, IndexError, KeyError, TypeError, AttributeError, UnicodeError) as exc:
            raise self._error(f"{type(exc).__name__}: {exc}") from None

    def _run(self, stream: io.RawIOBase | io.BytesIO) -> Any:
        # One flat stack; ``marks`` holds where each open MARK began, so no closure ever rebinds the stack.
        stack: list[Any] = []
        marks: list[int] = []
        memo: dict[int, Any] = {}

        def floor() -> int:
            return marks[-1] if marks else 0

        def pop_mark() -> list[Any]:
            if not marks:
                raise self._error("MARK expected")
            begin = marks.pop()
            items = stack[begin:]
            del stack[begin:]
            return items

        def pop() -> Any:
            if len(stack) <= floor():
                raise self._error("stack underflow")
            return stack.pop()

        def top() -> Any:
            if len(stack) <= floor():
                raise self._error("stack underflow")
            return stack[-1]

        operations = 0
        for opcode, arg, _pos in pickletools.genops(stream):  # type: ignore[arg-type]
            op = opcode.name
            operations += 1
            if operations > MAX_OPERATIONS:
                raise self._limit(f"more than {MAX_OPERATIONS} operations")
            # The most frequent opcodes of torch pickles come first: this loop is the cost of opening a checkpoint.
            if op in _MEMO_PUT:
                memo[len(memo) if op == "MEMOIZE" else _memo_key(arg)] = top()
                continue
            if op in _MEMO_GET:
                key = _memo_key(arg)
                if key not in memo:
                    raise self._error(f"memo key {arg} missing")
                stack.append(memo[key])
                continue
            if op in _VALUE_OPS:
                stack.append(_VALUE_OPS[op](arg))
                continue
            if op in {"PROTO", "FRAME"}:
                continue
            if op == "STOP":
                if len(stack) != 1 or marks:
                    raise self._error("STOP with an unbalanced stack")
                return stack[0]
            if op == "MARK":
                if len(marks) >= MAX_MARK_DEPTH:
                    raise self._limit("nesting too deep")
                marks.append(len(stack))
            elif op == "POP":
                if len(stack) > floor():
                    stack.pop()
                else:
                    pop_mark()
            elif op == "POP_MARK":
                pop_mark()
            elif op == "DUP":
                stack.append(top())
            elif op in {"EMPTY_DICT"}:
                stack.append({})
            elif op in {"EMPTY_LIST"}:
                stack.append([])
            elif op in {"EMPTY_TUPLE"}:
                stack.append(())
            elif op == "EMPTY_SET":
                stack.append(PickleObject(GlobalRef("builtins", "set")))
            elif op in {"TUPLE1", "TUPLE2", "TUPLE3"}:
                count = int(op[-1])
                if len(stack) - floor() < count:
                    raise self._error("stack underflow")
                items = stack[-count:]
                del stack[-count:]
                stack.append(tuple(items))
            elif op == "TUPLE":
                stack.append(tuple(pop_mark()))
            elif op == "LIST":
                stack.append(pop_mark())
            elif op == "DICT":
                items = pop_mark()
                stack.append({_safe_key(items[i]): items[i + 1] for i in range(0, len(items) - 1, 2)})
            elif op == "FROZENSET":
                stack.append(PickleObject(GlobalRef("builtins", "frozenset"), (pop_mark(),)))
            elif op in {"APPEND", "APPENDS"}:
                items = [pop()] if op == "APPEND" else pop_mark()
                self._extend(top(), items)
            elif op == "ADDITEMS":
                items = pop_mark()
                self._extend(top(), items)
            elif op in {"SETITEM", "SETITEMS"}:
                if op == "SETITEM":
                    value = pop()
                    items = [pop(), value]
                else:
                    items = pop_mark()
                self._set_items(top(), items)
            elif op == "GLOBAL":
                module, _, name = str(arg).partition(" ")
                stack.append(self._global(module, name))
            elif op == "STACK_GLOBAL":
                name = pop()
                stack.append(self._global(pop(), name))
            elif op == "REDUCE":
                args = pop()
                factory = pop()
                if not isinstance(args, tuple):
                    raise self._error("REDUCE arguments are not a tuple")
                self._called(factory, args)
                stack.append(self.call(factory, args, None))
            elif op == "NEWOBJ":
                args = pop()
                cls = pop()
                args = tuple(args) if isinstance(args, tuple | list) else (args,)
                self._called(cls, args)
                stack.append(self.call(cls, args, None))
            elif op == "NEWOBJ_EX":
                kwargs = pop()
                args = pop()
                cls = pop()
                self._called(cls, tuple(args), kwargs if isinstance(kwargs, dict) else None)
                stack.append(self.call(cls, tuple(args), kwargs if isinstance(kwargs, dict) else None))
            elif op == "INST":
                module, _, name = str(arg).partition(" ")
                ref, args = self._global(module, name), tuple(pop_mark())
                self._called(ref, args)
                stack.append(self.call(ref, args, None))
            elif op == "OBJ":
                items = pop_mark()
                if not items:
                    raise self._error("OBJ without a class")
                self._called(items[0], tuple(items[1:]))
                stack.append(self.call(items[0], tuple(items[1:]), None))
            elif op == "BUILD":
                state = pop()
                self._build(top(), state)
            elif op in {"PERSID", "BINPERSID"}:
                pid = arg if op == "PERSID" else pop()
                if self.persistent_load is None:
                    raise self._error("a persistent id where none is expected")
                stack.append(self.persistent_load(pid))
            elif op in {"EXT1", "EXT2", "EXT4"}:
                stack.append(self._global("copyreg.extension", str(arg)))
            elif op == "NEXT_BUFFER":
                # torch.load passes no out-of-band buffers: pickle.load raises here, and nothing after it runs
                raise self._error("an out-of-band buffer, which torch.load never passes (pickle.load stops here)")
            elif op == "READONLY_BUFFER":
                # a read-only view of the object on top: what it is does not change the globals reached
                if not stack:
                    raise self._error("stack underflow")
            else:
                raise self._error(f"unsupported opcode {op}")
        raise self._error("no STOP opcode (truncated)")

    def _extend(self, target: Any, items: list[Any]) -> None:
        if isinstance(target, list):
            target.extend(items)
        elif isinstance(target, PickleObject):
            target.list_items.extend(items)
        else:
            raise self._error(f"APPENDS onto a {type(target).__name__}")

    def _set_items(self, target: Any, items: list[Any]) -> None:
        if len(items) % 2:
            raise self._error("SETITEMS with an odd number of items")
        pairs = [(_safe_key(items[i]), items[i + 1]) for i in range(0, len(items), 2)]
        if isinstance(target, dict):
            target.update(pairs)
        elif isinstance(target, PickleObject):
            target.dict_items.extend(pairs)
        else:
            raise self._error(f"SETITEMS onto a {type(target).__name__}")

    def _build(self, target: Any, state: Any) -> None:
        if isinstance(target, PickleObject) and isinstance(target.factory, GlobalRef) and not _plain_state(state):
            built = target.factory
            if built.qualname in _REBUILD_HELPERS and target.args and isinstance(target.args[0], GlobalRef):
                built = target.args[0]  # copyreg._reconstructor(cls, ...): the instance is cls's
            self._mark(built, (state,))  # BUILD of such a state only means something to a __setstate__
        if isinstance(target, PickleObject):
            target.state = state if target.state is None else (target.state, state)
        elif isinstance(target, dict) and isinstance(state, dict):
            target.update((_safe_key(k), v) for k, v in state.items())
        # BUILD on anything else (a tensor record, a string) carries nothing a scan needs.


def _plain_state(state: Any) -> bool:
    """A state the default ``__setstate__`` takes (a ``__dict__``, or ``(__dict__, slots)``), as a dataclass, an
    ``argparse.Namespace`` or ``TrainingArguments`` pickles."""
    if state is None or isinstance(state, dict):
        return True
    pairs = isinstance(state, tuple) and len(state) == 2
    return pairs and all(part is None or isinstance(part, dict) for part in state)


def _reconstructor_is_plain(args: tuple[Any, ...]) -> bool:
    """``copyreg._reconstructor(cls, object, None)`` is ``object.__new__(cls)``; another base runs that base's
    ``__new__``/``__init__`` on the state."""
    return len(args) == 3 and args[1] == GlobalRef("builtins", "object") and args[2] is None


_REBUILD_HELPERS: dict[str, Callable[[tuple[Any, ...]], bool]] = {
    "copyreg._reconstructor": _reconstructor_is_plain,
    "copyreg.__newobj__": lambda args: len(args) <= 1,  # protocol 2's NEWOBJ spelled as REDUCE: cls(*args[1:])
    "copyreg.__newobj_ex__": lambda args: len(args) == 3 and not args[1] and not args[2],
}
"""Allowed helpers that call the class they are handed (their first argument): whether a call only makes a bare
instance, which is then rebuilt from plain state."""


def _literal(arg: Any) -> Any:
    return arg  # genops has already decoded the literal; pushing it is all these opcodes do


_LITERAL_OPCODES = (
    "INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "FLOAT", "BINFLOAT",
    "STRING", "BINSTRING", "SHORT_BINSTRING", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8", "BYTEARRAY8",
    "UNICODE", "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8",
)  # fmt: skip
_VALUE_OPS: dict[str, Callable[[Any], Any]] = dict.fromkeys(_LITERAL_OPCODES, _literal)
_MEMO_PUT = frozenset({"PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"})
_MEMO_GET = frozenset({"GET", "BINGET", "LONG_BINGET"})
_VALUE_OPS.update({"NONE": lambda _arg: None, "NEWTRUE": lambda _arg: True, "NEWFALSE": lambda _arg: False})


def unpickle(
    data: bytes,
    *,
    where: str,
    call: CallHook = default_call,
    persistent_load: PersistentHook | None = None,
) -> tuple[Any, list[GlobalRef]]:
    """Interpret one pickle; return (inert value, globals referenced)."""
    machine = SafeUnpickler(data, where=where, call=call, persistent_load=persistent_load)
    return machine.load(), machine.globals_seen
