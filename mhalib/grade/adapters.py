"""Calling a learner's function in the child: the forbidden calls and the call adapters.

Before any learner code runs, :func:`setup_forbidden` makes ``import mhalib`` give
stand-ins that raise :class:`ForbiddenCall`, and replaces the torch functions an exercise
forbids as torch loads. :func:`call` then runs one case through an adapter: a plain
function, a torch module built from the case's weights, or a conversion to
``torch.nn.MultiheadAttention``; the result comes back as plain data (:func:`to_plain`).
The grader's child and :mod:`mhalib.grade.check` (in the learner's kernel) both call
through here.

Standard library, NumPy and torch only: the child runs this module's source too.
"""

import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import sys
import types

import numpy as np

if __name__ != "__main__":  # imported; in the child the wire's source comes first in the same script
    from mhalib.grade.wire import MAX_DEPTH, NUMBER_KINDS, Unsupported

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
