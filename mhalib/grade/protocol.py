"""The only language the grader and its child process share: JSON and plain arrays.

A message is a JSON header followed by zero or more arrays, each a frame of bytes
written by ``np.save``. Every frame starts with its length (8 bytes, big-endian).
Arrays are read back with ``np.load(allow_pickle=False)``, so nothing the student's
process sends can run code in the grader: the worst it can send is wrong numbers,
which the grader then marks wrong.

Values (arguments and results) are encoded as small JSON trees::

    {"kind": "array", "index": 0}            # the 0th array frame of the message
    {"kind": "int" | "float" | "bool" | "str", "value": ...}
    {"kind": "none"}
    {"kind": "tuple", "items": [...]}         # a tuple or list
    {"kind": "unsupported", "type": "Foo", "why": "..."}   # results only
"""

from __future__ import annotations

import io
import json
import math
import os
import select
import time

import numpy as np

__all__ = [
    "ProtocolError",
    "ChildDied",
    "ChildTimeout",
    "send",
    "recv",
    "encode_value",
    "decode_value",
]

MAX_HEADER = 1 << 20  # 1 MiB of JSON
MAX_MESSAGE = 64 << 20  # 64 MiB in all
MAX_DEPTH = 4
_ALLOWED_KINDS = set("biufc")


class ProtocolError(Exception):
    """The other side sent something that is not a well-formed message."""


class ChildDied(ProtocolError):
    """The pipe closed: the process on the other side exited."""


class ChildTimeout(ProtocolError):
    """No complete message arrived before the deadline."""


def _frame(payload: bytes) -> bytes:
    return len(payload).to_bytes(8, "big") + payload


def _array_bytes(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=False)
    return buf.getvalue()


def send(fd: int, header: dict, arrays=()) -> None:
    """Write one message (header plus arrays) to file descriptor ``fd``."""
    header = dict(header, n_arrays=len(arrays))
    chunks = [_frame(json.dumps(header, allow_nan=True).encode())]
    chunks += [_frame(_array_bytes(a)) for a in arrays]
    data = b"".join(chunks)
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


class _Reader:
    def __init__(self, fd, deadline):
        self.fd, self.deadline, self.buf, self.total = fd, deadline, bytearray(), 0

    def read(self, n):
        while len(self.buf) < n:
            if self.deadline is not None:
                left = self.deadline - time.monotonic()
                if left <= 0:
                    raise ChildTimeout("no reply before the time limit")
                ready, _, _ = select.select([self.fd], [], [], left)
                if not ready:
                    raise ChildTimeout("no reply before the time limit")
            chunk = os.read(self.fd, max(65536, n - len(self.buf)))
            if not chunk:
                raise ChildDied("the process exited")
            self.total += len(chunk)
            if self.total > MAX_MESSAGE + 1024:
                raise ProtocolError(f"reply larger than {MAX_MESSAGE >> 20} MiB")
            self.buf += chunk
        out, self.buf = bytes(self.buf[:n]), self.buf[n:]
        return out

    def frame(self, limit):
        n = int.from_bytes(self.read(8), "big")
        if n > limit:
            raise ProtocolError(f"a frame of {n} bytes is over the limit of {limit}")
        return self.read(n)


def recv(fd: int, timeout: float | None = None):
    """Read one message; returns ``(header, arrays)``.

    Raises :class:`ChildTimeout` after ``timeout`` seconds, :class:`ChildDied` on end of
    file and :class:`ProtocolError` on anything malformed or too large.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    reader = _Reader(fd, deadline)
    try:
        header = json.loads(reader.frame(MAX_HEADER).decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"malformed header: {exc}") from None
    if not isinstance(header, dict):
        raise ProtocolError("malformed header: not an object")
    n = header.get("n_arrays", 0)
    if not isinstance(n, int) or not 0 <= n <= 64:
        raise ProtocolError(f"malformed header: n_arrays={n!r}")
    arrays = []
    for _ in range(n):
        raw = reader.frame(MAX_MESSAGE)
        try:
            a = np.load(io.BytesIO(raw), allow_pickle=False)
        except Exception as exc:  # a malformed .npy: never trust it
            raise ProtocolError(f"malformed array: {type(exc).__name__}: {exc}") from None
        if not isinstance(a, np.ndarray):
            raise ProtocolError("malformed array")
        arrays.append(a)
    return header, arrays


def encode_value(value, arrays, *, depth=0):
    """Plain value -> JSON tree, appending arrays to ``arrays``.

    Used for the grader's arguments and for the child's results. Anything that is not
    an array, a number, a bool, a string, None or a tuple/list of those becomes
    ``{"kind": "unsupported"}`` naming its type.
    """
    if isinstance(value, np.ndarray) or isinstance(value, np.generic):
        a = np.asarray(value)
        if a.dtype.kind not in _ALLOWED_KINDS or a.dtype.fields is not None:
            return {"kind": "unsupported", "type": f"array of dtype {a.dtype}",
                    "why": "only arrays of numbers can be graded"}
        arrays.append(np.ascontiguousarray(a))
        return {"kind": "array", "index": len(arrays) - 1}
    if value is None:
        return {"kind": "none"}
    if isinstance(value, Unsupported):
        return {"kind": "unsupported", "type": value.type_name, "why": value.why}
    if type(value) is bool:
        return {"kind": "bool", "value": value}
    if type(value) is int:
        return {"kind": "int", "value": value}
    if type(value) is float:
        return {"kind": "float", "value": value if math.isfinite(value) else repr(value)}
    if type(value) is str:
        return {"kind": "str", "value": value[:1000]}
    if type(value) in (tuple, list):
        if depth >= MAX_DEPTH:
            return {"kind": "unsupported", "type": type(value).__name__, "why": "nested too deeply"}
        return {"kind": "tuple", "items": [encode_value(v, arrays, depth=depth + 1) for v in value[:16]],
                "length": len(value)}
    return {"kind": "unsupported", "type": type(value).__name__, "why": ""}


class Unsupported:
    """A result the child could not express as plain data (e.g. a custom object)."""

    def __init__(self, type_name, why=""):
        self.type_name, self.why = str(type_name)[:200], str(why)[:500]

    def __repr__(self):
        return f"<{self.type_name}>"


def decode_value(tree, arrays, *, depth=0):
    """JSON tree -> plain value (arrays, Python numbers, tuples, :class:`Unsupported`)."""
    if not isinstance(tree, dict) or depth > MAX_DEPTH + 1:
        raise ProtocolError("malformed value")
    kind = tree.get("kind")
    if kind == "array":
        index = tree.get("index")
        if not isinstance(index, int) or not 0 <= index < len(arrays):
            raise ProtocolError("malformed value: bad array index")
        a = arrays[index]
        if a.dtype.kind not in _ALLOWED_KINDS or a.dtype.fields is not None:
            return Unsupported(f"array of dtype {a.dtype}", "only arrays of numbers can be graded")
        return a
    if kind == "none":
        return None
    if kind == "bool":
        return bool(tree.get("value"))
    if kind == "int":
        v = tree.get("value")
        if type(v) is not int:
            raise ProtocolError("malformed int")
        return v
    if kind == "float":
        v = tree.get("value")
        if isinstance(v, str):
            return float(v) if v in ("nan", "inf", "-inf") else float("nan")
        if type(v) not in (int, float):
            raise ProtocolError("malformed float")
        return float(v)
    if kind == "str":
        return str(tree.get("value"))[:1000]
    if kind == "tuple":
        items = tree.get("items")
        if not isinstance(items, list):
            raise ProtocolError("malformed tuple")
        return tuple(decode_value(v, arrays, depth=depth + 1) for v in items)
    if kind == "unsupported":
        return Unsupported(tree.get("type", "?"), tree.get("why", ""))
    raise ProtocolError(f"malformed value kind {kind!r}")
