"""How a graded function is called: the same code in the grader's child and in ``check()``.

* :func:`call` runs one case: it builds what the exercise needs (a plain function
  call, or a torch module loaded with the grader's weights), calls the learner's
  code, and turns the result into plain data with :func:`to_plain`.
* :class:`Tripwire` records calls to forbidden functions (e.g. the library's own
  implementation) while the learner's function runs.

Only NumPy is imported here; torch is imported when a torch exercise needs it.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import sys
import threading

import numpy as np

from mhalib.grade.protocol import Unsupported

__all__ = ["GradingError", "Tripwire", "call", "to_plain", "describe_signature", "changed_inputs"]

_MISSING = object()


class GradingError(Exception):
    """The learner's code could not be called the way the exercise asks (message for the learner)."""


def _mhalib_dir():
    spec = importlib.util.find_spec("mhalib")
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.join(os.path.realpath(list(spec.submodule_search_locations)[0]), "")


# Parts of mhalib that the learner may always use (or that run as part of grading itself).
ALWAYS_ALLOWED = ("mhalib.grade.", "mhalib.check.", "mhalib.validation.", "mhalib.plots.",
                  "mhalib.widgets.")


# How a forbidden callable is named in feedback (the public name, not where it lives).
FRIENDLY_NAMES = {
    "torch._C._nn.scaled_dot_product_attention": "torch.nn.functional.scaled_dot_product_attention",
    "torch.nn.modules.activation.MultiheadAttention.forward": "torch.nn.MultiheadAttention",
    "torch.nn.modules.activation.MultiheadAttention.__init__": "torch.nn.MultiheadAttention",
    "torch.nn.functional.multi_head_attention_forward": "torch.nn.MultiheadAttention",
}


class Tripwire:
    """Record calls to forbidden callables while the learner's function runs.

    Rules are dotted names: ``"mhalib.np_attention.causal_mask"`` (one function,
    matched by its module and qualified name, wherever it was imported from),
    ``"mhalib.attention.*"`` (a whole module), ``"torch.nn.modules.activation.MultiheadAttention.forward"``
    (a method), or ``"torch._C._nn.scaled_dot_product_attention"`` (a built-in). Python
    functions are recognised by where their code lives, so copying the function object
    or importing it under another name does not hide it.

    Use as a context manager; afterwards ``hits`` lists what was called, and
    ``tampered`` is True when the learner's code switched the tracing off.
    """

    def __init__(self, rules):
        self.exact = {r for r in rules if not r.endswith(".*")}
        self.prefixes = tuple(r[:-1] for r in rules if r.endswith(".*"))
        self.hits = []
        self.tampered = False
        self._root = _mhalib_dir()
        self._names = {}
        self._previous = None
        self._bound = self._hook  # one bound method, so that `is` can recognise it

    def _module_of(self, code, frame):
        filename = code.co_filename
        cached = self._names.get(filename)
        if cached is not None:
            return cached
        real = os.path.realpath(filename) if os.path.isabs(filename) else filename
        if self._root and real.startswith(self._root):
            rel = os.path.splitext(real[len(self._root):])[0].split(os.sep)
            if rel[-1] == "__init__":
                rel = rel[:-1]
            name = ".".join(["mhalib", *rel])
            self._names[filename] = name
            return name
        return frame.f_globals.get("__name__", "") if frame is not None else ""

    def _matches(self, name):
        if name.startswith(ALWAYS_ALLOWED):
            return False
        return name in self.exact or name.startswith(self.prefixes)

    def _record(self, name):
        name = FRIENDLY_NAMES.get(name, name)
        if name not in self.hits and len(self.hits) < 10:
            self.hits.append(name)

    def _hook(self, frame, event, arg):
        try:
            if event == "call":
                code = frame.f_code
                qual = getattr(code, "co_qualname", code.co_name)
                name = f"{self._module_of(code, frame)}.{qual}"
                if self._matches(name):
                    self._record(name)
            elif event == "c_call":
                mod = getattr(arg, "__module__", None) or ""
                qual = getattr(arg, "__qualname__", None) or getattr(arg, "__name__", "?")
                name = f"{mod}.{qual}"
                if self._matches(name):
                    self._record(name)
        except Exception:  # the hook must never break the learner's code
            pass

    def __enter__(self):
        self._previous = sys.getprofile()
        if self.exact or self.prefixes:
            threading.setprofile(self._bound)  # threads started during the call too
            sys.setprofile(self._bound)
        return self

    def __exit__(self, *exc):
        if self.exact or self.prefixes:
            if sys.getprofile() is not self._bound:
                self.tampered = True
            sys.setprofile(self._previous)
            threading.setprofile(None)
        return False


def to_plain(value, *, depth=0):
    """The learner's result as plain data: NumPy arrays, Python numbers, tuples.

    torch tensors become NumPy arrays (same dtype); a list or tuple of plain numbers
    becomes a float array; anything else stays as it is (the encoder marks it
    unsupported, and the judge says what type came back).
    """
    if depth > 3:
        return value
    if type(value) in (tuple, list):
        if value and all(type(v) in (int, float) for v in value):
            return np.asarray(value, dtype=np.float64)
        return tuple(to_plain(v, depth=depth + 1) for v in value)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        t = value.detach()
        if t.dtype == torch.bfloat16:
            return Unsupported("torch.bfloat16 tensor", "NumPy has no bfloat16")
        try:
            return np.array(t.cpu().numpy(), copy=True)
        except Exception:
            return value
    if isinstance(value, np.ndarray):
        return np.array(value, copy=True, subok=False)  # drops subclasses and their __eq__
    if isinstance(value, np.generic):
        return np.asarray(value)
    return value


def describe_signature(fn):
    try:
        return f"{getattr(fn, '__name__', '?')}{inspect.signature(fn)}"
    except (TypeError, ValueError):
        return getattr(fn, "__name__", "?")


def _check_binds(fn, name, args, kwargs, expected):
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    try:
        sig.bind(*args, **kwargs)
    except TypeError as exc:
        raise GradingError(
            f"wrong signature: the exercise asks for {expected}, the notebook defines "
            f"{name}{sig} ({exc})"
        ) from None


def _copy_args(args, kwargs):
    """Fresh copies for the learner, and the originals kept for the mutation check."""
    args = [np.array(a, copy=True) if isinstance(a, np.ndarray) else a for a in args]
    kwargs = {k: np.array(v, copy=True) if isinstance(v, np.ndarray) else v for k, v in kwargs.items()}
    return args, kwargs


def changed_inputs(after, args, kwargs):
    """Labels of the inputs that differ after the call from the originals ``args``/``kwargs``.

    ``after`` is ``[(label, key, array)]`` with ``key`` an argument index or a keyword
    name. The grader runs this in its own process, on the arrays the child sent back.
    """
    changed = []
    for label, key, value in after:
        original = args[key] if isinstance(key, int) and 0 <= key < len(args) else kwargs.get(key)
        if not isinstance(original, np.ndarray):
            continue
        try:
            same = (isinstance(value, np.ndarray) and value.shape == original.shape
                    and np.array_equal(value, original, equal_nan=True))
        except Exception:
            same = False
        if not same:
            changed.append(str(label))
    return changed


def mutation_message(name, changed):
    return (f"{name} changed its input {', '.join(changed)} in place; work on a copy "
            "(e.g. `z = z.copy()`) and leave the caller's arrays as they were")


# ----------------------------------------------------------------------------- adapters
# An adapter gets the learner's namespace (a dict), the graded name, the case's
# arguments and keyword arguments (plain data) and a Tripwire; it returns the raw result.

def _call_function(ns, name, args, kwargs, params, tripwire):
    fn = ns.get(name, _MISSING)
    if fn is _MISSING:
        raise GradingError(f"no function named {name} was found: define it with `def {name}(...)`")
    if not callable(fn) or isinstance(fn, type):
        raise GradingError(f"{name} is a {type(fn).__name__}, not a function")
    _check_binds(fn, name, args, kwargs, params.get("signature", name))
    args, kwargs = _copy_args(args, kwargs)
    call_args = list(args)
    torch_args = params.get("torch_args") or ()
    if torch_args:  # a torch exercise: these arguments arrive as tensors (sharing the copies' memory)
        torch = _torch()
        for i in torch_args:
            if i < len(call_args) and isinstance(call_args[i], np.ndarray):
                call_args[i] = torch.from_numpy(call_args[i])
    with tripwire:
        result = fn(*call_args, **kwargs)
    labels = params.get("arg_names", [])
    after = [(labels[i] if i < len(labels) else f"argument {i + 1}", i, a)
             for i, a in enumerate(args) if isinstance(a, np.ndarray)]
    after += [(k, k, v) for k, v in kwargs.items() if isinstance(v, np.ndarray)]
    return result, after


def _torch():
    import torch  # noqa: PLC0415 - only torch exercises pay for it

    return torch


def _build_module(ns, params):
    """The learner's module class, built and loaded with the grader's weights."""
    torch = _torch()
    cls_name = params["class"]
    cls = ns.get(cls_name, _MISSING)
    if cls is _MISSING:
        raise GradingError(f"no class named {cls_name} was found: define `class {cls_name}(nn.Module)`")
    if not isinstance(cls, type) or not issubclass(cls, torch.nn.Module):
        raise GradingError(f"{cls_name} must be a class derived from torch.nn.Module; got {type(cls).__name__}")
    d_model, num_heads = params["d_model"], params["num_heads"]
    try:
        module = cls(d_model, num_heads)
    except NotImplementedError:
        raise
    except TypeError as exc:
        raise GradingError(
            f"could not build {cls_name}({d_model}, {num_heads}): {exc}; the exercise asks for "
            f"__init__(self, d_model, num_heads)"
        ) from None
    return module


def _load_weights(module, cls_name, weights):
    torch = _torch()
    for attr, w in weights.items():
        layer = getattr(module, attr, None)
        if layer is None:
            raise GradingError(f"{cls_name} has no attribute {attr}: name the projections W_Q, W_K, W_V, W_O")
        if not isinstance(layer, torch.nn.Linear):
            raise GradingError(f"{cls_name}.{attr} must be an nn.Linear; got {type(layer).__name__}")
        if tuple(layer.weight.shape) != tuple(w.shape):
            raise GradingError(
                f"{cls_name}.{attr}.weight has shape {tuple(layer.weight.shape)}; expected "
                f"{tuple(w.shape)} (nn.Linear(d_model, d_model))"
            )
        if layer.bias is not None:
            raise GradingError(f"{cls_name}.{attr} has a bias; the exercise asks for bias=False")
        with torch.no_grad():
            layer.weight.copy_(torch.from_numpy(np.array(w, dtype=np.float32)))


def _call_torch_module(ns, name, args, kwargs, params, tripwire):
    """Exercise 03's module: build it, load W_Q..W_O, run forward on x."""
    torch = _torch()
    module = _build_module(ns, params)
    cls_name = params["class"]
    x, weights = args[0], params_weights(args[1:])
    _load_weights(module, cls_name, weights)
    module.eval()
    x_copy = np.array(x, dtype=np.float32)
    xt = torch.from_numpy(x_copy)  # shares memory with x_copy, sent back for the mutation check
    forward = getattr(type(module), "forward", None)
    if forward is not None:
        _check_binds(forward, f"{cls_name}.forward", (module, xt), kwargs,
                     params.get("signature", "forward(self, x, causal=False, use_sdpa=False)"))
    with torch.no_grad(), tripwire:
        result = module(xt, **kwargs)
    return result, [("x", 0, x_copy)]


def params_weights(arrays):
    return dict(zip(("W_Q", "W_K", "W_V", "W_O"), arrays))


def _call_to_torch_mha(ns, name, args, kwargs, params, tripwire):
    """Exercise 03's conversion: the learner's module -> nn.MultiheadAttention.

    Returns the converted layer's ``in_proj_weight``, ``out_proj.weight`` and its output
    on ``x``, computed with torch's own forward (captured before any learner code ran).
    """
    torch = _torch()
    fn = ns.get(name, _MISSING)
    if fn is _MISSING:
        raise GradingError(f"no function named {name} was found: define it with `def {name}(module)`")
    if not callable(fn) or isinstance(fn, type):
        raise GradingError(f"{name} is a {type(fn).__name__}, not a function")
    module = _build_module(ns, params)
    x, weights = args[0], params_weights(args[1:])
    _load_weights(module, params["class"], weights)
    _check_binds(fn, name, (module,), {}, params.get("signature", name))
    with torch.no_grad(), tripwire:
        mha = fn(module)
    real = _TORCH_ORIGINALS.get("MultiheadAttention")
    if real is None or not isinstance(mha, real):
        raise GradingError(f"{name} must return a torch.nn.MultiheadAttention; got {type(mha).__name__}")
    if not mha.batch_first:
        raise GradingError(f"{name} returned a layer with batch_first=False; create it with batch_first=True")
    if mha.in_proj_weight is None:
        raise GradingError(f"{name} returned a layer with separate q/k/v weights; use "
                           "nn.MultiheadAttention(d_model, H, batch_first=True, bias=False)")
    if mha.in_proj_bias is not None or mha.out_proj.bias is not None:
        raise GradingError(f"{name} returned a layer with biases; create it with bias=False")
    mha.eval()
    xt = torch.from_numpy(np.array(x, dtype=np.float32))
    with torch.no_grad():
        out = _TORCH_ORIGINALS["forward"](mha, xt, xt, xt, need_weights=False)[0]
    return (mha.in_proj_weight.detach(), mha.out_proj.weight.detach(), out), []


_TORCH_ORIGINALS = {}


def capture_torch():
    """Remember torch's own MultiheadAttention (class and forward) before learner code runs."""
    torch = _torch()
    _TORCH_ORIGINALS.setdefault("MultiheadAttention", torch.nn.MultiheadAttention)
    _TORCH_ORIGINALS.setdefault("forward", torch.nn.MultiheadAttention.forward)


ADAPTERS = {
    "function": _call_function,
    "torch_module": _call_torch_module,
    "torch_to_mha": _call_to_torch_mha,
}


def call(adapter, ns, name, args, kwargs, params, forbidden=()):
    """Run one case of graded ``name`` from namespace ``ns``.

    Returns ``(result, hits, tampered, after)``: the raw result, the forbidden names
    called, whether tracing was switched off, and the input arrays as they were after
    the call (``[(label, key, array)]``, for :func:`changed_inputs`). Raises
    :class:`GradingError` for a call that could not be made as the exercise asks, or
    whatever the learner's code raised.
    """
    if adapter.startswith("torch") or params.get("torch_args"):
        capture_torch()
    tripwire = Tripwire(forbidden)
    result, after = ADAPTERS[adapter](ns, name, list(args), dict(kwargs), params, tripwire)
    return result, tripwire.hits, tripwire.tampered, after
