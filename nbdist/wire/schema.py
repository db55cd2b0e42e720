"""How a message dataclass becomes its header: the checks on receipt and the fields written,
both derived from the class's annotations (`nbdist.wire.messages` declares the messages).

A field's annotation says what a received header may hold there: `int`, `float` (a JSON
number; a bool is neither), `bool`, `str`, `X | None`, `list[X]`, `dict[str, X]`, `tuple[X,
Y]` (a JSON list of that length), `EpochKey` (an epoch number as a JSON object key: digits),
a nested message (a JSON object, checked by its own schema), or a dataclass with
`from_list`/`to_list` (its fields as a JSON list, e.g. a `Chunk`). `decode` refuses a header
with a field of the wrong type, an unknown field or a missing one as
`ProtocolError("malformed header")` before anything reads it, so a signed but malformed header
is dropped like any other bad message; `encode` writes the fields that differ from their
defaults, and `decode` fills those in again. The envelope is the codec's (`nbdist.hub.protocol`).
Pure: no sockets, nothing but the standard library, so the core builds and reads messages too.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from typing import ClassVar, NamedTuple, NewType, TypeVar

from nbdist.errors import ProtocolError

# The envelope: what the codec sets on every header and checks first (nbdist.hub.protocol),
# and a reply's `re` (the sequence number of the request it answers). Skipped by `decode`.
ENVELOPE = ("run", "from", "to", "seq", "nbytes", "op")
ENVELOPE_FIELDS = (*ENVELOPE, "re")

EpochKey = NewType("EpochKey", str)  # an epoch number as a JSON object key ("0", "12")
T = TypeVar("T", bound="Wire")
_MISSING = object()  # a required field's default
_UNKNOWN = object()  # a header key no field and no envelope field has


class Kind(NamedTuple):
    """What one annotation accepts on the wire, and how the value crosses it."""

    types: frozenset  # the exact JSON types accepted (a bool is no int)
    deep: Callable[[object], bool] | None = None  # a check of a list's or object's contents
    load: Callable | None = None  # wire form -> field value (nested messages, tuples, chunks)
    dump: Callable | None = None  # field value -> wire form

    def accepts(self, value: object) -> bool:
        return type(value) in self.types and (self.deep is None or value is None
                                              or self.deep(value))


def kind_of(annotation) -> Kind:
    """The `Kind` of a field annotation (see the module docstring for the ones supported).

    Example:
        >>> kind_of(list[int]).accepts([1, 2]), kind_of(list[int]).accepts([1, True])
        (True, False)
        >>> (kind_of(dict[EpochKey, list[float]]).accepts({"0": [1.5]}),
        ...  kind_of(float | None).accepts(None))
        (True, True)
    """
    if annotation is float:
        return Kind(frozenset((int, float)))
    if annotation in (int, bool, str, list, dict):
        return Kind(frozenset((annotation,)))
    if annotation is EpochKey:
        return Kind(frozenset((str,)), str.isdigit)
    if isinstance(getattr(annotation, "schema", None), Schema):  # a nested message: a JSON object
        schema = annotation.schema
        return Kind(frozenset((dict,)), schema.accepts, schema.build, schema.fields_of)
    if dataclasses.is_dataclass(annotation) and hasattr(annotation, "to_list"):
        # its fields as a list
        parts = [kind_of(t) for t in typing.get_type_hints(annotation).values()]
        return Kind(frozenset((list,)), _all_of(parts), lambda v: annotation(*v),
                    annotation.to_list)
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        if len(inner) != 1:
            raise TypeError(f"a message field may be `X | None`, not {annotation}")
        kind = kind_of(inner[0])
        return kind._replace(types=kind.types | {type(None)})
    if origin is list:
        item = kind_of(args[0])
        load = None if item.load is None else (lambda v: [item.load(x) for x in v])
        dump = None if item.dump is None else (lambda v: [item.dump(x) for x in v])
        return Kind(frozenset((list,)), _each(item), load, dump)
    if origin is tuple:
        return Kind(frozenset((list,)), _all_of([kind_of(a) for a in args]), tuple)
    if origin is dict:
        key, value = _test(kind_of(args[0])), _test(kind_of(args[1]))
        return Kind(frozenset((dict,)), lambda v: all(key(k) and value(x) for k, x in v.items()))
    raise TypeError(f"no wire form for a message field of type {annotation}")


def _test(kind: Kind) -> Callable[[object], bool]:
    """`kind.accepts` as one function (the checks nest these)."""
    types, deep = kind.types, kind.deep
    if deep is None:
        return lambda v: type(v) in types
    if type(None) in types:
        return lambda v: type(v) in types and (v is None or deep(v))
    return lambda v: type(v) in types and deep(v)


def _each(item: Kind) -> Callable[[list], bool]:
    """The check of a list whose items are all of `item`'s kind."""
    if item.deep is None:
        types = item.types
        return lambda v: all(type(x) in types for x in v)
    test = _test(item)
    return lambda v: all(map(test, v))


def _all_of(parts: list[Kind]) -> Callable[[list], bool]:
    """The check of a list with one item of each of `parts`' kinds, in order."""
    n = len(parts)
    if all(p.deep is None and p.types == parts[0].types for p in parts):
        each = _each(parts[0])
        return lambda v: len(v) == n and each(v)
    tests = [_test(p) for p in parts]
    return lambda v: len(v) == n and all(t(x) for t, x in zip(tests, v, strict=True))


class Schema:
    """The wire form of one message class: its fields' `Kind`s and defaults."""

    def __init__(self, cls: type, op: str | None):
        hints = typing.get_type_hints(cls)
        self.cls, self.op = cls, op
        fields = dataclasses.fields(cls)
        # None: skipped
        self.kinds: dict[str, Kind | None] = dict.fromkeys(ENVELOPE_FIELDS if op else ())
        self.kinds.update({f.name: kind_of(hints[f.name]) for f in fields})
        self.defaults = {f.name: (f.default if f.default is not dataclasses.MISSING else
                                  f.default_factory()
                                  if f.default_factory is not dataclasses.MISSING
                                  else _MISSING) for f in fields}
        self.checks = {name: None if k is None else (k.types, k.deep)
                       for name, k in self.kinds.items()}
        self.required = [name for name, default in self.defaults.items() if default is _MISSING]
        self.loads = [(name, k.load) for name, k in self.kinds.items()
                      if k is not None and k.load is not None]
        self.dumps = {name: k.dump for name, k in self.kinds.items()
                      if k is not None and k.dump is not None}

    def problems(self, header: Mapping) -> list[str]:
        """What is wrong with `header` for this message ([]: nothing)."""
        wrong, unknown = [], []
        for name, value in header.items():
            kind = self.kinds.get(name, _UNKNOWN)
            if kind is _UNKNOWN:
                unknown.append(name)
            elif kind is not None and not kind.accepts(value):
                wrong.append(name)
        missing = [name for name in self.required if name not in header]
        return [f"{what} {', '.join(map(str, names))}" for what, names in (
            ("wrong type or value of", wrong), ("lacks", missing), ("unknown field(s)", unknown))
            if names]

    def accepts(self, header: object) -> bool:
        return type(header) is dict and not self.problems(header)

    def decode(self, header: Mapping):
        """The message `header` holds, or ProtocolError("malformed header") (one pass when
        nothing is wrong: the hub's per-push path)."""
        checks, values = self.checks, {}
        for name, value in header.items():
            check = checks.get(name, _UNKNOWN)
            if check is None:  # the envelope: the codec checked it
                continue
            if check is _UNKNOWN or type(value) not in check[0] or (
                    check[1] is not None and value is not None and not check[1](value)):
                self._refuse(header)
            values[name] = value
        if len(values) < len(self.required) or not all(name in values for name in self.required):
            self._refuse(header)
        return self.build(values)

    def _refuse(self, header: Mapping) -> None:
        raise ProtocolError("malformed header",
                            f"{'; '.join(self.problems(header))} ({self.cls.__name__})")

    def build(self, values: Mapping):
        """The message from checked wire values (nested parts turned into their types)."""
        if self.loads:
            values = dict(values)
            for name, load in self.loads:
                value = values.get(name)
                if value is not None:
                    values[name] = load(value)
        return self.cls(**values)

    def fields_of(self, message, out: dict | None = None) -> dict:
        """The wire fields of `message` that differ from their defaults (added to `out`)."""
        out, defaults, dumps = {} if out is None else out, self.defaults, self.dumps
        for name, value in message.__dict__.items():
            default = defaults[name]
            if value is default or value == default:
                continue
            out[name] = value if value is None or name not in dumps else dumps[name](value)
        return out


class Wire:
    """Base of every message class (made with `message`): its header in and out."""

    OP: ClassVar[str | None] = None
    schema: ClassVar[Schema]

    @classmethod
    def decode(cls: type[T], header: Mapping) -> T:
        """The message in a received header, checked (ProtocolError("malformed header"))."""
        return cls.schema.decode(header)

    def encode(self) -> dict:
        """The header to send: `op` and the fields that differ from their defaults."""
        return self.schema.fields_of(self, {"op": self.OP} if self.OP else {})


def message(op: str | None = None) -> Callable[[type[T]], type[T]]:
    """Make a `Wire` subclass a dataclass with its schema; `op`: what its header's op is
    (None: a part nested in other messages)."""

    def make(cls: type[T]) -> type[T]:
        cls = dataclasses.dataclass(cls)
        cls.OP = op
        cls.schema = Schema(cls, op)
        return cls

    return make
