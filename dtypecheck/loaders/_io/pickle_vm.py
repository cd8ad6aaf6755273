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


USES = ("call", "value", "new", "state", "setstate", "items", "handed", "patched", "instance-called", "sized")
"""How a pickle can use a global, besides pushing and storing it (a *plain reference*, inert):

- ``call``: called (``REDUCE``, ``NEWOBJ`` with arguments, ``INST``, ``OBJ``, or by a rebuild helper that calls or
  subclasses with it: ``_rebuild_from_type_v2``'s function and type, ``_rebuild_wrapper_subclass``'s class);
- ``value``: called with exactly one plain value (a str, a number, None) each time: how an enum member is pickled;
- ``new``: made into a bare instance (``NEWOBJ`` without arguments, ``copyreg._reconstructor(cls, object, None)``,
  ``copyreg.__newobj__(cls)``): only ``cls.__new__`` runs;
- ``state`` / ``setstate``: an instance of it is ``BUILD`` with a plain ``__dict__`` (and slots) / with any other
  state, which only a custom ``__setstate__`` takes;
- ``items``: an instance of it gets ``SETITEMS``/``APPENDS`` (a dict or list subclass);
- ``handed``: passed as a direct argument to a call, whose callee may call it (``numpy.random``'s constructors call
  their ``bit_generator_ctor``);
- ``patched``: ``BUILD`` onto the global itself: sets attributes of a module or class (monkeypatching the names a
  later global resolves to);
- ``instance-called``: an instance of it (rebuilt by the pickle) is called (a module whose ``forward`` the state
  replaced);
- ``sized``: one of ``SIZED_CALLS`` (a callable that allocates, or counts, as many elements as its integer arguments
  say) is called with a count, or a shape, over ``SIZE_LIMIT`` (``bytearray(10**12)``, ``range(10**12)`` handed to
  ``list``, ``torch.FloatStorage(10**12)``, ``numpy.ndarray((10**6, 10**6))``): ``torch.load`` would allocate or
  loop that much before any scan of the result could bound it. ``torch.save`` and ``numpy`` never call these with
  a size: tensors come from the archive's records, arrays from ``_reconstruct(ndarray, (0,), ...)`` + ``BUILD``."""

SIZE_LIMIT = 2**24
"""The largest count or shape (elements or bytes, 16 Mi) a call of ``SIZED_CALLS`` may take without ``sized``."""

_SHAPED = (
    *(f"torch.{kind}{name}" for kind in ("", "cuda.", "sparse.", "cuda.sparse.") for name in (
        "DoubleStorage", "FloatStorage", "HalfStorage", "BFloat16Storage", "LongStorage", "IntStorage",
        "ShortStorage", "CharStorage", "ByteStorage", "BoolStorage", "ComplexDoubleStorage", "ComplexFloatStorage",
        "DoubleTensor", "FloatTensor", "HalfTensor", "BFloat16Tensor", "LongTensor", "IntTensor", "ShortTensor",
        "CharTensor", "ByteTensor", "BoolTensor", "QInt8Storage", "QInt32Storage", "QUInt8Storage",
        "QUInt4x2Storage", "QUInt2x4Storage")),
    "torch.Tensor", "torch.UntypedStorage", "torch.TypedStorage", "torch.storage.UntypedStorage",
    "torch.storage.TypedStorage", "torch.nn.parameter.Parameter", "torch.nn.parameter.Buffer",
    "numpy.ndarray", "numpy.core.multiarray._reconstruct", "numpy._core.multiarray._reconstruct",
)  # fmt: skip
SIZED_CALLS: dict[str, str] = {
    "builtins.bytearray": "count",
    "builtins.bytes": "count",
    "builtins.range": "count",
    **dict.fromkeys(_SHAPED, "shape"),
}
"""Allowed callables whose integer arguments size what they allocate (or iterate): ``count`` (any one integer
argument is the size), ``shape`` (the product of the integer arguments, and of the integers of a tuple or list
argument, is)."""


@dataclass(frozen=True)
class GlobalRef:
    """An inert reference to ``module.name``, standing where the real unpickler would import it."""

    module: str
    name: str
    uses: frozenset[str] = field(default=frozenset(), compare=False)
    """How the stream uses it (``USES``); empty for a plain reference. Not part of equality: a global is one
    global however it is used, and every use of it (through the memo too) is recorded on the one entry."""

    @property
    def qualname(self) -> str:
        return f"{self.module}.{self.name}"

    @property
    def called(self) -> bool:
        """Anything beyond a plain reference or an enum lookup runs code of the global's on the pickle's data."""
        return bool(self.uses - {"value"})

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
BuildHook = Callable[["SafeUnpickler", Any], None]


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
        data: bytes | io.RawIOBase | io.BytesIO,
        *,
        where: str,
        call: CallHook = default_call,
        persistent_load: PersistentHook | None = None,
        after_build: BuildHook | None = None,
    ) -> None:
        self.stream: io.RawIOBase | io.BytesIO = io.BytesIO(data) if isinstance(data, bytes) else data
        self.where = where
        self.call = call
        self.persistent_load = persistent_load
        self.after_build = after_build
        """Called with the object each ``BUILD`` gave its state, before the next opcode is read: an unpickler that
        reads more of the stream there (joblib's, for a numpy array's bytes) is followed by reading it too."""
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

    def _called(
        self, factory: Any, args: tuple[Any, ...], kwargs: dict[Any, Any] | None = None, new: bool = False
    ) -> None:
        """Record how a call uses the globals involved. ``new``: ``NEWOBJ`` (``cls.__new__(cls, *args)``), whose
        call without arguments only makes a bare instance."""
        for arg in (*args, *(kwargs or {}).values()):
            if isinstance(arg, GlobalRef) and not (isinstance(factory, GlobalRef) and factory.qualname in _HELPERS):
                self._use(arg, "handed")
        if not isinstance(factory, GlobalRef):
            root = instance_class(factory)
            if root is not None:
                self._use(root, "instance-called")
            return
        helper = _HELPERS.get(factory.qualname)
        if helper is not None:
            helper(self, args, kwargs)
            return
        self._use(factory, _call_kind(args, kwargs, new))
        self._sized(factory, args, kwargs)

    def _sized(self, factory: GlobalRef, args: tuple[Any, ...], kwargs: dict[Any, Any] | None = None) -> None:
        """Record ``sized`` when a ``SIZED_CALLS`` callable gets a size over ``SIZE_LIMIT``."""
        kind = SIZED_CALLS.get(factory.qualname)
        if kind is not None and _size(kind, (*args, *(kwargs or {}).values())) > SIZE_LIMIT:
            self._use(factory, "sized")

    def absorb(self, refs: list[GlobalRef]) -> None:
        """Count the globals of another pickle (one nested in this stream) as this one's, with their uses."""
        for ref in refs:
            mine = self._global(ref.module, ref.name)
            for kind in ref.uses:
                self._use(mine, kind)

    def _use(self, ref: GlobalRef, kind: str) -> None:
        index = self._index.get(ref)
        if index is None:
            return
        before = self.globals_seen[index]
        if kind not in before.uses:
            self.globals_seen[index] = GlobalRef(ref.module, ref.name, before.uses | {kind})

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
                self._called(cls, args, new=True)
                stack.append(self.call(cls, args, None))
            elif op == "NEWOBJ_EX":
                kwargs = pop()
                args = pop()
                cls = pop()
                self._called(cls, tuple(args), kwargs if isinstance(kwargs, dict) else {"": kwargs}, new=True)
                stack.append(self.call(cls, tuple(args), kwargs if isinstance(kwargs, dict) else None))
            elif op == "INST":
                module, _, name = str(arg).partition(" ")
                ref, args = self._global(module, name), tuple(pop_mark())
                self._called(ref, args)
                self._use(ref, "call")  # INST: pickle's _instantiate probes the class, then calls it
                stack.append(self.call(ref, args, None))
            elif op == "OBJ":
                items = pop_mark()
                if not items:
                    raise self._error("OBJ without a class")
                self._called(items[0], tuple(items[1:]))
                if isinstance(items[0], GlobalRef):
                    self._use(items[0], "call")
                stack.append(self.call(items[0], tuple(items[1:]), None))
            elif op == "BUILD":
                state = pop()
                self._build(top(), state)
                if self.after_build is not None:
                    self.after_build(self, top())
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
            self._instance_use(target, "items")
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
            self._instance_use(target, "items")
            target.dict_items.extend(pairs)
        else:
            raise self._error(f"SETITEMS onto a {type(target).__name__}")

    def _instance_use(self, instance: PickleObject, kind: str) -> None:
        root = instance_class(instance)
        if root is not None:
            self._use(root, kind)

    def _build(self, target: Any, state: Any) -> None:
        if isinstance(target, GlobalRef):
            self._use(target, "patched")  # BUILD sets the attributes of the module or class itself
        elif isinstance(target, PickleObject):
            self._instance_use(target, "state" if _plain_state(state) else "setstate")
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


def _plain_value(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


def _size(kind: str, args: tuple[Any, ...]) -> int:
    """The count (largest integer argument) or shape (product of the nonzero integer arguments and of those of
    tuple and list arguments) that ``args`` give a ``SIZED_CALLS`` callable of this kind."""
    ints = [abs(a) for a in args if isinstance(a, int) and not isinstance(a, bool)]
    if kind == "count":
        return max(ints, default=0)
    for arg in args:
        if isinstance(arg, tuple | list):
            ints.extend(abs(a) for a in arg if isinstance(a, int) and not isinstance(a, bool))
    size = 1
    for value in ints:
        size *= max(value, 1)
        if size > SIZE_LIMIT:
            break
    return size if ints else 0


def _call_kind(args: tuple[Any, ...], kwargs: dict[Any, Any] | None, new: bool) -> str:
    if kwargs:
        return "call"
    if not args:
        return "new" if new else "call"
    return "value" if len(args) == 1 and _plain_value(args[0]) else "call"


def instance_class(value: Any, depth: int = 8) -> GlobalRef | None:
    """The global whose instance ``value`` (an inert ``PickleObject``) stands for, if any."""
    while isinstance(value, PickleObject) and depth > 0:
        factory = value.factory
        if isinstance(factory, GlobalRef):
            if factory.qualname in _INSTANCE_OF_FIRST_ARGUMENT and value.args and isinstance(value.args[0], GlobalRef):
                return value.args[0]  # copyreg._reconstructor(cls, ...): the instance is cls's
            return factory
        value, depth = factory, depth - 1
    return None


def _reconstructor(machine: SafeUnpickler, args: tuple[Any, ...], _kwargs: dict[Any, Any] | None) -> None:
    """``copyreg._reconstructor(cls, base, state)``: ``object.__new__(cls)`` when ``base`` is ``object`` and
    ``state`` None; otherwise ``base.__new__(cls, state)`` and ``base.__init__(obj, state)`` run."""
    cls = args[0] if args else None
    base = args[1] if len(args) > 1 else None
    plain = len(args) == 3 and base == GlobalRef("builtins", "object") and args[2] is None
    if isinstance(cls, GlobalRef):
        machine._use(cls, "new" if plain else "call")
    if isinstance(base, GlobalRef):
        machine._use(base, "call")
        machine._sized(base, tuple(args[2:3]))  # base.__init__(obj, state): bytearray.__init__(obj, 10**12)
    for arg in args[2:]:
        if isinstance(arg, GlobalRef):
            machine._use(arg, "handed")


def _newobj(machine: SafeUnpickler, args: tuple[Any, ...], kwargs: dict[Any, Any] | None) -> None:
    """``copyreg.__newobj__(cls, *args)``, protocol 2's ``NEWOBJ`` spelled as a ``REDUCE``."""
    if args and isinstance(args[0], GlobalRef):
        machine._use(args[0], _call_kind(args[1:], kwargs, new=True))
        machine._sized(args[0], args[1:], kwargs)
    for arg in args[1:]:
        if isinstance(arg, GlobalRef):
            machine._use(arg, "handed")


def _newobj_ex(machine: SafeUnpickler, args: tuple[Any, ...], _kwargs: dict[Any, Any] | None) -> None:
    """``copyreg.__newobj_ex__(cls, args, kwargs)``."""
    inner = tuple(args[1]) if len(args) > 1 and isinstance(args[1], tuple | list) else ()
    inner_kwargs = args[2] if len(args) > 2 and isinstance(args[2], dict) else None
    if args and isinstance(args[0], GlobalRef):
        odd = len(args) != 3 or (len(args) > 2 and not isinstance(args[2], dict | type(None)))
        machine._use(args[0], "call" if odd else _call_kind(inner, inner_kwargs, new=True))
        machine._sized(args[0], inner, inner_kwargs)
    for arg in (*inner, *(inner_kwargs or {}).values()):
        if isinstance(arg, GlobalRef):
            machine._use(arg, "handed")


def _rebuild_from_type(machine: SafeUnpickler, args: tuple[Any, ...], _kwargs: dict[Any, Any] | None) -> None:
    """``_rebuild_from_type_v2(func, new_type, args, state)`` calls ``func(*args)``, makes the result an instance
    of ``new_type`` (``as_subclass``) and hands ``state`` to that type's ``__setstate__`` if it has its own."""
    inner = args[2] if len(args) > 2 else ()
    machine._called(args[0] if args else None, tuple(inner) if isinstance(inner, tuple | list) else (inner,))
    if isinstance(args[0] if args else None, GlobalRef) and not inner:
        machine._use(args[0], "call")  # func() runs it even without arguments
    for arg in args[1:2]:
        if isinstance(arg, GlobalRef):
            machine._use(arg, "call")
    for arg in args[3:]:
        if isinstance(arg, GlobalRef):
            machine._use(arg, "handed")


def _first_argument_called(machine: SafeUnpickler, args: tuple[Any, ...], _kwargs: dict[Any, Any] | None) -> None:
    """``_rebuild_wrapper_subclass(cls, ...)`` makes a ``cls`` through its tensor subclass machinery."""
    for index, arg in enumerate(args):
        if isinstance(arg, GlobalRef):
            machine._use(arg, "call" if index == 0 else "handed")


_HELPERS: dict[str, Callable[[SafeUnpickler, tuple[Any, ...], dict[Any, Any] | None], None]] = {
    "copyreg._reconstructor": _reconstructor,
    "copyreg.__newobj__": _newobj,
    "copyreg.__newobj_ex__": _newobj_ex,
    "torch._tensor._rebuild_from_type_v2": _rebuild_from_type,
    "torch._utils._rebuild_from_type_v2": _rebuild_from_type,
    "torch._utils._rebuild_wrapper_subclass": _first_argument_called,
}
"""Callables (allowed ones, or torch's own rebuilds) that call, or make instances of, the globals they are handed:
how each uses its arguments. Every other callable's global arguments are ``handed``."""
_INSTANCE_OF_FIRST_ARGUMENT = frozenset({"copyreg._reconstructor", "copyreg.__newobj__", "copyreg.__newobj_ex__"})


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
