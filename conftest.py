"""pytest set-up shared by the unit tests and the notebook runs (nbval).

nbval starts one Jupyter kernel per notebook, two at a time under pytest-xdist. Kernels
started side by side over TCP can pick a port another process takes first; such a kernel
dies before it answers (a race known upstream: jupyter/jupyter_client#154,
treebeardtech/nbmake#129). Its start is tried again, up to three times in all, with a
warning that says so; a notebook's cells are never run twice, and any other failure is
reported as it is.
"""

from __future__ import annotations

import functools
import warnings

KERNEL_STARTS = 3


def retry_kernel_start(start, attempts=KERNEL_STARTS):
    """``start`` (nbval's ``start_new_kernel``), tried again when the kernel dies starting."""

    @functools.wraps(start)
    def start_new_kernel(*args, **kwargs):
        for attempt in range(1, attempts + 1):
            try:
                return start(*args, **kwargs)
            except RuntimeError as exc:
                if attempt == attempts or "Kernel died before replying" not in str(exc):
                    raise
                warnings.warn(f"a notebook's kernel died while starting ({exc}); starting it again "
                              f"({attempt + 1} of {attempts})", RuntimeWarning, stacklevel=2)
        raise AssertionError("unreachable")

    return start_new_kernel


try:
    import nbval.kernel
except ImportError:  # nbval is a test dependency; without it there are no notebook runs to guard
    pass
else:
    if not hasattr(nbval.kernel.start_new_kernel, "__wrapped__"):
        nbval.kernel.start_new_kernel = retry_kernel_start(nbval.kernel.start_new_kernel)
