"""The grader's child process, and the wire format it shares with the grader.

The sandbox starts this file's source as ``python -I -S -c SOURCE CONFIG``: standard
library and NumPy (torch when needed), no ``mhalib``. Before any learner code it drops to
the unprivileged user of CONFIG and applies its limits (or exits: nothing is graded), and
makes forbidden calls unusable (``import mhalib`` gives stand-ins that raise
:class:`ForbiddenCall`; so do the torch functions the exercise forbids, replaced as torch
loads). Then it answers ``exec`` (one cell, run as Jupyter does) and ``call`` (one case).

Wire format: a JSON header and up to 64 arrays, each an ``np.save`` frame read back with
``allow_pickle=False``; every frame starts with its length (8 bytes, big-endian). Values
are JSON trees: ``{"kind": "array", "index": 0}``, ``{"kind": "int" | "float" | "bool" |
"str", "value": ...}``, ``{"kind": "none"}``, ``{"kind": "tuple", "items": [...]}``,
``{"kind": "unsupported", "type": ..., "why": ...}``. The grader imports this module for
the wire format; :mod:`mhalib.grade.check` calls a learner's function through :func:`call`.
"""

import builtins
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import io
import json
import math
import os
import re
import select
import sys
import time
import traceback
import types

import numpy as np

MAX_HEADER = 1 << 20  # a reply's JSON; requests may carry a notebook cell, up to MAX_FRAME
MAX_FRAME = 64 << 20
MAX_ARRAYS = 64
MAX_DEPTH = 4
NUMBER_KINDS = set("biufc")
DENIED_EXIT = 70  # the child could not drop its privileges: it ran nothing
ORPHAN_EXIT = 71  # the child's parent ended before it was ready: it ran nothing
FILTER_EXIT = 72  # the child could not install its system-call filter: it ran nothing


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


# ----------------------------------------------------------------------------- forbidden calls
class ForbiddenCall(Exception):
    """A call the exercise does not allow (the course library, or a forbidden torch function)."""


class GradingError(Exception):
    """The learner's code cannot be called as the exercise asks (the message says why)."""


# Public names of the forbidden callables, for feedback.
FRIENDLY_NAMES = {
    "torch._C._nn.scaled_dot_product_attention": "torch.nn.functional.scaled_dot_product_attention",
    "torch.nn.modules.activation.MultiheadAttention.forward": "torch.nn.MultiheadAttention",
    "torch.nn.modules.activation.MultiheadAttention.__init__": "torch.nn.MultiheadAttention",
    "torch.nn.functional.multi_head_attention_forward": "torch.nn.MultiheadAttention",
}
_STATE = {"forbidden": frozenset(), "hits": [], "rules": (), "always": frozenset(), "patched": False}


def _refuse(name):
    _STATE["hits"].append(name)
    raise ForbiddenCall(f"{name} is not available to graded code in this exercise: write it yourself")


class _Missing(types.ModuleType):
    """What ``mhalib`` and all in it are in the child: using one raises :class:`ForbiddenCall`."""

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Missing(f"{self.__name__}.{attr}")

    def __call__(self, *args, **kwargs):
        if self.__name__ != "mhalib.check.check":  # the self-check helper does nothing here
            _refuse(self.__name__)


class _Guard(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """First on ``sys.meta_path``: ``mhalib`` becomes stand-ins; torch is patched as it loads."""

    def find_spec(self, name, path=None, target=None):
        """The spec of a stand-in for ``mhalib`` and its modules, or torch's own (patched once loaded).

        ``None`` for every other module.
        """
        if name == "mhalib" or name.startswith("mhalib."):
            return importlib.util.spec_from_loader(name, self, is_package=True)
        if name == "torch":
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is not None and spec.loader is not None:
                load = spec.loader.exec_module

                def exec_module(module):
                    load(module)
                    patch_torch()
                spec.loader.exec_module = exec_module
            return spec
        return None

    def create_module(self, spec):
        """The stand-in module for ``spec``: a :class:`_Missing` package."""
        module = _Missing(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        """Nothing to run: the stand-in has no code."""
        pass


def _stub(name, original):
    """What replaces a forbidden torch function: it raises, when the running graded function
    forbids it. Forbidden in all of them, it keeps no reference to the original."""
    friendly, always = FRIENDLY_NAMES.get(name, name), name in _STATE["always"]
    original = None if always else original

    def forbidden(*args, **kwargs):
        if always or name in _STATE["forbidden"]:
            _refuse(friendly)
        return original(*args, **kwargs)
    forbidden.__name__ = forbidden.__qualname__ = name.rsplit(".", 1)[-1]
    return forbidden


def patch_torch():
    """Replace the torch functions the exercise forbids, wherever torch keeps them."""
    if _STATE["patched"] or "torch" not in sys.modules:
        return
    _STATE["patched"] = True
    torch_modules = [m for n, m in list(sys.modules.items()) if n.split(".")[0] == "torch" and m is not None]
    for rule in _STATE["rules"]:
        parts = rule.split(".")
        if parts[0] != "torch" or rule.endswith("*"):
            continue
        for i in range(len(parts) - 1, 0, -1):
            owner = sys.modules.get(".".join(parts[:i]))
            if owner is not None:
                break
        try:
            for part in parts[i:-1]:
                owner = getattr(owner, part)
            original = getattr(owner, parts[-1])
        except AttributeError:
            continue
        stub = _stub(rule, original)
        for module in [owner] if isinstance(owner, type) else torch_modules:
            for key, value in list(getattr(module, "__dict__", {}).items()):
                if value is original or (module is owner and key == parts[-1]):
                    setattr(module, key, stub)


def setup_forbidden(per_function):
    """``per_function``: the forbidden rules of each graded function of the exercise."""
    lists = [frozenset(rules) for rules in per_function] or [frozenset()]
    _STATE["rules"] = tuple(sorted(frozenset().union(*lists)))
    _STATE["always"] = frozenset.intersection(*lists)
    sys.meta_path.insert(0, _Guard())


class Forbidding:
    """While a graded call runs: the calls of ``rules`` raise; afterwards ``hits`` lists them."""

    def __init__(self, rules):
        self.rules, self.hits = frozenset(rules), []

    def __enter__(self):
        patch_torch()  # torch loaded while the guard was away is patched now
        _STATE["forbidden"], _STATE["hits"] = self.rules, []
        return self

    def __exit__(self, *exc):
        self.hits = list(dict.fromkeys(_STATE["hits"]))[:10]
        _STATE["forbidden"], _STATE["hits"] = frozenset(), []
        return False


# ----------------------------------------------------------------------------- calling
_MISSING = object()
_TORCH_ORIGINALS = {}


def _torch():  # torch's own MultiheadAttention and forward, kept before any learner code runs
    import torch

    _TORCH_ORIGINALS.setdefault("class", torch.nn.MultiheadAttention)
    _TORCH_ORIGINALS.setdefault("forward", torch.nn.MultiheadAttention.forward)
    return torch


def to_plain(value, depth=0):
    """The learner's result as plain data: NumPy arrays, Python numbers, tuples."""
    if depth > MAX_DEPTH:
        return value
    if type(value) in (tuple, list):
        if value and all(type(v) in (int, float) for v in value):
            return np.asarray(value, dtype=np.float64)
        return tuple(to_plain(v, depth + 1) for v in value)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        t = value.detach()
        if t.dtype == torch.bfloat16:
            return Unsupported("torch.bfloat16 tensor", "NumPy has no bfloat16")
        try:
            return np.array(t.cpu().numpy(), copy=True)
        except Exception:  # noqa: BLE001
            return Unsupported(f"torch tensor of dtype {t.dtype}")
    if isinstance(value, (np.ndarray, np.generic)):
        return np.array(value, copy=True, subok=False)  # drops subclasses and their __eq__
    return value


def _function(ns, name, hint):
    fn = ns.get(name, _MISSING)
    if fn is _MISSING:
        raise GradingError(f"no function named {name} was found: define it with `{hint}`")
    if not callable(fn) or isinstance(fn, type):
        raise GradingError(f"{name} is a {type(fn).__name__}, not a function")
    return fn


def _check_binds(fn, name, args, kwargs, expected):
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # no signature to check
        sig = None
    try:
        sig and sig.bind(*args, **kwargs)
    except TypeError as exc:
        raise GradingError(f"wrong signature: the exercise asks for {expected}, the notebook defines "
                           f"{name}{sig} ({exc})") from None


def _call_function(ns, name, args, kwargs, params, guard):
    fn = _function(ns, name, f"def {name}(...)")
    _check_binds(fn, name, args, kwargs, params.get("signature", name))
    args = [np.array(a, copy=True) if isinstance(a, np.ndarray) else a for a in args]
    kwargs = {k: np.array(v, copy=True) if isinstance(v, np.ndarray) else v for k, v in kwargs.items()}
    call_args = list(args)
    for i in params.get("torch_args") or ():  # these arrive as tensors, sharing the copies' memory
        if i < len(call_args) and isinstance(call_args[i], np.ndarray):
            call_args[i] = _torch().from_numpy(call_args[i])
    with guard:
        result = fn(*call_args, **kwargs)
    labels = params.get("arg_names", [])
    after = [(labels[i] if i < len(labels) else f"argument {i + 1}", i, a)
             for i, a in enumerate(args) if isinstance(a, np.ndarray)]
    return result, after + [(k, k, v) for k, v in kwargs.items() if isinstance(v, np.ndarray)]


def _build_module(ns, params, weights):
    """The learner's module class, built and loaded with the grader's weights."""
    torch = _torch()
    cls_name, d_model, num_heads = params["class"], params["d_model"], params["num_heads"]
    cls = ns.get(cls_name, _MISSING)
    if cls is _MISSING:
        raise GradingError(f"no class named {cls_name} was found: define `class {cls_name}(nn.Module)`")
    if not isinstance(cls, type) or not issubclass(cls, torch.nn.Module):
        raise GradingError(f"{cls_name} must be a class derived from torch.nn.Module; got {type(cls).__name__}")
    try:
        module = cls(d_model, num_heads)
    except TypeError as exc:
        raise GradingError(f"could not build {cls_name}({d_model}, {num_heads}): {exc}; the exercise asks "
                           "for __init__(self, d_model, num_heads)") from None
    for attr, w in zip(("W_Q", "W_K", "W_V", "W_O"), weights):
        layer = getattr(module, attr, None)
        if not isinstance(layer, torch.nn.Linear):
            raise GradingError(f"{cls_name}.{attr} must be an nn.Linear (name the projections W_Q, W_K, W_V, "
                               f"W_O); got {type(layer).__name__}")
        if tuple(layer.weight.shape) != tuple(w.shape):
            raise GradingError(f"{cls_name}.{attr}.weight has shape {tuple(layer.weight.shape)}; expected "
                               f"{tuple(w.shape)} (nn.Linear(d_model, d_model))")
        if layer.bias is not None:
            raise GradingError(f"{cls_name}.{attr} has a bias; the exercise asks for bias=False")
        with torch.no_grad():
            layer.weight.copy_(torch.from_numpy(np.array(w, dtype=np.float32)))
    return module


def _call_torch_module(ns, name, args, kwargs, params, guard):
    """Exercise 03's module: build it, load W_Q..W_O, run forward on x."""
    torch = _torch()
    with guard:
        module = _build_module(ns, params, args[1:])
    module.eval()
    x = np.array(args[0], dtype=np.float32)
    forward = getattr(type(module), "forward", None)
    if forward is not None:
        _check_binds(forward, f"{params['class']}.forward", (module, x), kwargs,
                     params.get("signature", "forward(self, x)"))
    with torch.no_grad(), guard:
        result = module(torch.from_numpy(x), **kwargs)  # x is sent back for the mutation check
    return result, [("x", 0, x)]


def _call_to_torch_mha(ns, name, args, kwargs, params, guard):
    """Exercise 03's conversion: the layer's weights and its output, by torch's own forward."""
    torch = _torch()
    fn = _function(ns, name, f"def {name}(module)")
    module = _build_module(ns, params, args[1:])
    _check_binds(fn, name, (module,), {}, params.get("signature", name))
    with torch.no_grad(), guard:
        mha = fn(module)
    if not isinstance(mha, _TORCH_ORIGINALS["class"]):
        raise GradingError(f"{name} must return a torch.nn.MultiheadAttention; got {type(mha).__name__}")
    if not mha.batch_first:
        raise GradingError(f"{name} returned a layer with batch_first=False; create it with batch_first=True")
    if mha.in_proj_weight is None or mha.in_proj_bias is not None or mha.out_proj.bias is not None:
        what = "separate q/k/v weights" if mha.in_proj_weight is None else "biases"
        raise GradingError(f"{name} returned a layer with {what}; use "
                           "nn.MultiheadAttention(d_model, H, batch_first=True, bias=False)")
    mha.eval()
    xt = torch.from_numpy(np.array(args[0], dtype=np.float32))
    with torch.no_grad():
        out = _TORCH_ORIGINALS["forward"](mha, xt, xt, xt, need_weights=False)[0]
    return (mha.in_proj_weight.detach(), mha.out_proj.weight.detach(), out), []


ADAPTERS = {"function": _call_function, "torch_module": _call_torch_module, "torch_to_mha": _call_to_torch_mha}


def call(adapter, ns, name, args, kwargs, params, guard):
    """Run one case of ``name`` from namespace ``ns``; ``guard`` wraps the learner's code
    and lists forbidden calls in ``guard.hits``. Returns ``(result, after)``, ``after``
    the input arrays as the call left them (``[(label, key, array)]``); raises
    :class:`GradingError` when the code cannot be called as asked, or what it raised."""
    if adapter.startswith("torch") or params.get("torch_args"):
        _torch()
    return ADAPTERS[adapter](ns, name, list(args), dict(kwargs), params, guard)


# ----------------------------------------------------------------------------- cells
_KEEP_CELL_MAGICS = ("%%time", "%%timeit", "%%capture", "%%prun")


def python_source(source):
    """IPython syntax -> plain Python (magics and shell escapes become ``pass``, ``x = !ls``
    ``x = None``); ``None`` for a cell that is not Python (``%%bash``, ``%%writefile``, ...)."""
    lines = source.splitlines()
    if lines and lines[0].lstrip().startswith("%%"):
        if not lines[0].lstrip().startswith(_KEEP_CELL_MAGICS):
            return None
        lines = lines[1:]
    lines = [re.sub(r"^(\s*)[%!].*", r"\1pass", re.sub(r"^(\s*[\w.]+\s*=)\s*[%!].*", r"\1 None", line))
             for line in lines]
    return "\n".join(lines)


def describe(exc):
    """``"Type: message"`` for an exception, the message cut to 400 characters; ``SystemExit`` explained."""
    if isinstance(exc, SystemExit):
        return "SystemExit (sys.exit() or exit() was called)"
    try:
        text = str(exc)[:400]
    except BaseException:  # noqa: BLE001 - a message that cannot be read
        text = "(a message that could not be read)"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def where(tb):
    """``"line L of cell N"`` for the innermost frame of a traceback in a cell, or ``""``."""
    frames = [f for f in traceback.extract_tb(tb) if f.filename.startswith("<cell")]
    return f"line {frames[-1].lineno} of {frames[-1].filename.strip('<>')}" if frames else ""


def run_cell(ns, source, index):
    """Run one cell as Jupyter does; returns the error that ended it (or ``None``)."""
    source = python_source(source)
    if source is None:
        return None
    try:
        code = compile(source, f"<cell {index}>", "exec")
    except SyntaxError as exc:
        return f"cell {index}, line {exc.lineno}: {type(exc).__name__}: {exc.msg}"
    except BaseException as exc:  # noqa: BLE001 - e.g. a NUL byte in the source
        return f"cell {index}: {describe(exc)}"
    try:
        exec(code, ns)  # noqa: S102 - this process exists to run the learner's code
    except BaseException as exc:  # noqa: BLE001 - SystemExit and KeyboardInterrupt included
        return f"{where(exc.__traceback__) or f'cell {index}'}: {describe(exc)}"
    return None


# ----------------------------------------------------------------------------- the child
class _Counter(io.TextIOBase):
    """``sys.stdout`` and ``sys.stderr`` of the child: counts what is printed, keeps nothing."""

    count = 0

    def write(self, s):
        """Count the characters of ``s`` and drop them; returns their number."""
        _Counter.count += len(str(s))
        return len(str(s))


def _confine(config, parent):
    """Limits, then the unprivileged user, then death with ``parent`` (the pid that started
    it); exits without running anything if that fails."""
    import ctypes
    import resource
    import signal

    limits = config.get("limits", {})
    for which, value in ((resource.RLIMIT_AS, limits.get("memory_mb", 0) << 20), (resource.RLIMIT_CORE, -1),
                         (resource.RLIMIT_CPU, limits.get("cpu_s", 0)), (resource.RLIMIT_NPROC, limits.get("nproc", 0)),
                         (resource.RLIMIT_FSIZE, limits.get("file_mb", 0) << 20)):
        try:
            hard = resource.getrlimit(which)[1]
            value = max(value, 0) if hard == resource.RLIM_INFINITY else min(max(value, 0), hard)
            if value or which == resource.RLIMIT_CORE:
                resource.setrlimit(which, (value, value))
        except (ValueError, OSError):
            pass
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails instead of killing
    uid, gid = config.get("uid"), config.get("gid")
    try:
        if uid is not None and os.getuid() != uid:
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
        if sys.platform.startswith("linux"):  # elsewhere (a learner's own Mac) there is no prctl
            libc = ctypes.CDLL(None)
            libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
            # PR_SET_PDEATHSIG: killed when its parent ends (the grader, or bubblewrap, which
            # ends with the grader; as root bubblewrap cannot signal another uid, and the
            # grader's guard does it). Set here, after the change of user, which clears it; a
            # parent already gone (another parent now) means no grader to answer.
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != parent:
                os._exit(ORPHAN_EXIT)
        if uid is not None and (os.getresuid() != (uid,) * 3 or os.getresgid() != (gid,) * 3 or _regains_root()):
            raise PermissionError("the user did not change for good")
    except (OSError, ValueError, AttributeError):
        os._exit(DENIED_EXIT)
    if config.get("seccomp"):
        try:
            _install_filter(bytes.fromhex(config["seccomp"]))
        except (OSError, ValueError, AttributeError):
            os._exit(FILTER_EXIT)


def _install_filter(program):
    """Install the seccomp program ``program`` (``struct sock_filter`` bytes, built by
    ``mhalib.grade.seccomp``) on this process and everything it starts from now on."""
    import ctypes

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    libc = ctypes.CDLL(None, use_errno=True)
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = SockFprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS, which a filter requires of an unprivileged process
    if libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")


def _regains_root():
    try:
        os.setuid(0)
    except PermissionError:
        return False
    return True


def serve(fd_in, fd_out, config):
    """Answer the grader's ``exec`` and ``call`` requests until ``exit`` or a message that cannot be read."""
    owner = os.getpid()  # a process forked by learner code that returns here ends instead of answering
    ns = {"__name__": "__main__", "__builtins__": builtins, "display": lambda *a, **k: None}
    send(fd_out, {"op": "ready", "uid": os.getuid(), "euid": os.geteuid(), "filtered": bool(config.get("seccomp")),
                  "sees": [p for p in config.get("hidden", []) if os.access(p, os.R_OK)]})
    while True:
        try:
            header, arrays = recv(fd_in, max_header=MAX_FRAME)
        except ProtocolError:
            return
        op, reply, out_arrays = header.get("op"), {}, []
        before = _Counter.count
        if op == "exit":
            return
        if op == "exec":
            reply["error"] = run_cell(ns, str(header.get("source", "")), header.get("index", "?"))
        elif op == "call":
            guard = Forbidding(header.get("forbidden", ()))
            try:
                args = [decode_value(t, arrays) for t in header.get("args", [])]
                kwargs = {k: decode_value(t, arrays) for k, t in header.get("kwargs", {}).items()}
                result, after = call(header["adapter"], ns, header["name"], args, kwargs,
                                     header.get("params", {}), guard)
                reply["result"] = encode_value(to_plain(result), out_arrays)
                reply["after"] = [[label, key, encode_value(value, out_arrays)] for label, key, value in after]
                reply["status"] = "ok"
            except GradingError as exc:
                reply.update(status="grading_error", message=str(exc))
            except NotImplementedError as exc:
                reply.update(status="not_implemented", message=str(exc)[:300])
            except BaseException as exc:  # noqa: BLE001
                reply.update(status="exception", message=describe(exc), where=where(exc.__traceback__),
                             kinds=[c.__name__ for c in type(exc).__mro__][:12])
            if guard.hits:
                reply.update(status="forbidden", hits=guard.hits)
        reply["printed"] = _Counter.count - before
        if os.getpid() != owner:
            os._exit(0)
        send(fd_out, reply, out_arrays)


def main(argv):
    """The child's entry point: confine itself, set up the forbidden calls, then serve the grader.

    ``argv[1]`` is the JSON config; stdin and stdout carry the messages, printed output is only counted.
    """
    parent = os.getppid()
    config = json.loads(argv[1])
    fd_in, fd_out = os.dup(0), os.dup(1)  # private copies; 0, 1 and 2 go nowhere
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    _confine(config, parent)
    setup_forbidden(config.get("forbidden", []))
    if "torch" in config.get("preload", []):
        _torch()
    sys.stdout = sys.stderr = _Counter()
    sys.stdin = open(os.devnull)  # noqa: SIM115
    sys.argv = ["submission"]
    serve(fd_in, fd_out, config)
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv)
