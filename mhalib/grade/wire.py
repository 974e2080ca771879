"""The wire format between the grader and its child process.

A JSON header and up to 64 arrays, each an ``np.save`` frame read back with
``allow_pickle=False``; every frame starts with its length (8 bytes, big-endian). Values
are JSON trees: ``{"kind": "array", "index": 0}``, ``{"kind": "int" | "float" | "bool" |
"str", "value": ...}``, ``{"kind": "none"}``, ``{"kind": "tuple", "items": [...]}``,
``{"kind": "unsupported", "type": ..., "why": ...}``. Every read and write has a deadline;
a header with ``NaN``, ``Infinity`` or nesting deeper than ``MAX_DEPTH`` is a
:class:`ProtocolError`.

Standard library and NumPy only: the child runs this module's source too (see
:data:`mhalib.grade.sandbox.WORKER_SOURCE`).
"""

import io
import json
import math
import os
import select
import time

import numpy as np

MAX_HEADER = 1 << 20  # a reply's JSON; requests may carry a notebook cell, up to MAX_FRAME
MAX_FRAME = 64 << 20
MAX_ARRAYS = 64
MAX_DEPTH = 4
NUMBER_KINDS = set("biufc")


# ----------------------------------------------------------------------------- wire
class ProtocolError(Exception):
    """The other side sent something that is not a well-formed message."""


class Closed(ProtocolError):
    """The pipe closed: the other side has gone."""


class Timeout(ProtocolError):
    """The other side did not read or answer before the deadline."""


def _wait(fd, deadline, write):
    left = deadline - time.monotonic()
    ready = select.select([], [fd], [], max(left, 0))[1] if write else select.select([fd], [], [], max(left, 0))[0]
    if not ready:
        raise Timeout("no answer before the time limit" if not write else "the other side stopped reading")


def send(fd, header, arrays=(), deadline=None):
    """Write one message; with a ``deadline`` (``time.monotonic()``) the write never blocks past it."""
    frames = [json.dumps(dict(header, n_arrays=len(arrays))).encode()]
    for a in arrays:
        frames.append(io.BytesIO())
        np.save(frames[-1], a, allow_pickle=False)
        frames[-1] = frames[-1].getvalue()
    view = memoryview(b"".join(len(f).to_bytes(8, "big") + f for f in frames))
    while view:
        if deadline is not None:
            _wait(fd, deadline, write=True)
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            continue
        except (BrokenPipeError, ConnectionResetError):
            raise Closed("the other side closed the pipe") from None


class _Reader:
    def __init__(self, fd, deadline):
        self.fd, self.deadline, self.buf, self.total = fd, deadline, bytearray(), 0

    def read(self, n):
        """Exactly ``n`` bytes from the pipe, waiting until the deadline.

        Raises :class:`Closed` when the other side exits, :class:`ProtocolError` past the size limit.
        """
        while len(self.buf) < n:
            if self.deadline is not None:
                _wait(self.fd, self.deadline, write=False)
            try:
                chunk = os.read(self.fd, max(1 << 16, n - len(self.buf)))
            except BlockingIOError:
                continue
            if not chunk:
                raise Closed("the process on the other side exited")
            self.total += len(chunk)
            if self.total > MAX_FRAME + MAX_HEADER:
                raise ProtocolError(f"a message over {MAX_FRAME >> 20} MiB")
            self.buf += chunk
        out, self.buf = bytes(self.buf[:n]), self.buf[n:]
        return out

    def frame(self, limit):
        """One frame: its 8-byte big-endian length, then that many bytes (at most ``limit``)."""
        n = int.from_bytes(self.read(8), "big")
        if n > limit:
            raise ProtocolError(f"a frame of {n} bytes, over the limit of {limit}")
        return self.read(n)


def _no_constant(name):
    raise ValueError(f"{name} is not plain JSON")


def _finite_float(text):
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:30]} overflows")
    return value


def recv(fd, deadline=None, max_header=MAX_HEADER):
    """Read one message: ``(header, arrays)``; raises :class:`ProtocolError` (or a subclass).
    Only plain JSON is read: ``NaN``, ``Infinity`` and numbers that overflow a float are
    refused (a non-finite float travels as the string "nan", "inf" or "-inf")."""
    reader = _Reader(fd, deadline)
    try:
        header = json.loads(reader.frame(max_header), parse_constant=_no_constant, parse_float=_finite_float)
    except (ValueError, RecursionError) as exc:  # bad UTF-8 or JSON, or nested too deeply
        raise ProtocolError(f"a malformed header ({type(exc).__name__})") from None
    n = header.get("n_arrays") if isinstance(header, dict) else None
    if type(n) is not int or not 0 <= n <= MAX_ARRAYS:
        raise ProtocolError("a malformed header")
    arrays = []
    for raw in (reader.frame(MAX_FRAME) for _ in range(n)):
        try:
            arrays.append(np.load(io.BytesIO(raw), allow_pickle=False))
        except Exception as exc:  # noqa: BLE001 - never trust a malformed .npy
            raise ProtocolError(f"a malformed array ({type(exc).__name__})") from None
        if not isinstance(arrays[-1], np.ndarray):
            raise ProtocolError("a malformed array")
    return header, arrays


class Unsupported:
    """A result that is not plain data (e.g. a custom object): only its type travels."""

    def __init__(self, type_name, why=""):
        self.type_name, self.why = str(type_name)[:200], str(why)[:300]


def encode_value(value, arrays, depth=0):
    """Plain value -> JSON tree (arrays appended to ``arrays``). NumPy scalars and 0-d
    arrays travel as numbers; anything else that is not plain data as ``unsupported``."""
    if isinstance(value, (np.ndarray, np.generic)):
        a = np.asarray(value)
        if a.dtype.kind not in NUMBER_KINDS or a.dtype.fields is not None:
            return {"kind": "unsupported", "type": f"array of dtype {a.dtype}", "why": "only numbers can be graded"}
        if a.ndim == 0 and a.dtype.kind in "biuf":
            return encode_value(a.item(), arrays, depth)
        arrays.append(np.array(a, copy=True, subok=False))
        return {"kind": "array", "index": len(arrays) - 1}
    if value is None:
        return {"kind": "none"}
    if isinstance(value, Unsupported):
        return {"kind": "unsupported", "type": value.type_name, "why": value.why}
    if type(value) in (bool, int, str):
        return {"kind": type(value).__name__, "value": value if type(value) is not str else value[:1000]}
    if type(value) is float:
        return {"kind": "float", "value": value if math.isfinite(value) else repr(value)}
    if type(value) in (tuple, list):
        if depth >= MAX_DEPTH:
            return {"kind": "unsupported", "type": type(value).__name__, "why": "nested too deeply"}
        return {"kind": "tuple", "items": [encode_value(v, arrays, depth + 1) for v in value[:16]]}
    return {"kind": "unsupported", "type": type(value).__name__, "why": ""}


def decode_value(tree, arrays, depth=0):
    """JSON tree -> plain value (arrays, Python numbers, tuples, :class:`Unsupported`)."""
    if not isinstance(tree, dict) or depth > MAX_DEPTH:
        raise ProtocolError("a malformed value")
    kind, v = tree.get("kind"), tree.get("value")
    if kind == "array":
        index = tree.get("index")
        if type(index) is not int or not 0 <= index < len(arrays):
            raise ProtocolError("a malformed value: bad array index")
        a = arrays[index]
        if a.dtype.kind not in NUMBER_KINDS or a.dtype.fields is not None:
            return Unsupported(f"array of dtype {a.dtype}", "only numbers can be graded")
        return a
    if kind == "none":
        return None
    if kind in ("bool", "int", "str") and type(v).__name__ == kind:
        return v[:1000] if kind == "str" else v
    if kind == "float" and type(v) in (int, float):
        return float(v)
    if kind == "float" and v in ("nan", "inf", "-inf"):
        return float(v)
    if kind == "tuple" and isinstance(tree.get("items"), list):
        return tuple(decode_value(item, arrays, depth + 1) for item in tree["items"][:16])
    if kind == "unsupported":
        return Unsupported(tree.get("type", "?"), tree.get("why", ""))
    raise ProtocolError(f"a malformed value of kind {str(kind)[:20]!r}")
