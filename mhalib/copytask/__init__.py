"""The copy-task family (notebooks 04 and 08): a task, an attention-only model, its training.

Modules, one concept each:

* :mod:`mhalib.copytask.tasks`: copy tasks whose tokens repeat at a fixed or variable
  offset (:class:`CopyTask`, :func:`variable_offset_task`, :func:`fixed_offset_task`),
  seeded by :func:`make_generator`; :func:`distinct_tokens`.
* :mod:`mhalib.copytask.model`: :func:`copy_task_config`, the course's
  :class:`~mhalib.decoder.Decoder` without MLP and LayerNorm, positions on queries and keys
  only; :func:`load_pretrained` (notebook 04's shipped weights).
* :mod:`mhalib.copytask.training`: :func:`new_model`, :func:`train` (through
  :func:`mhalib.fit.fit`), :func:`evaluate` (with ``ablate=``), :func:`steps_to`.

Its heads are measured with :mod:`mhalib.interpret`, as every model of the course is.
"""

from mhalib.copytask.model import COPY_TASK_CONFIG, PRETRAINED, copy_task_config, load_pretrained
from mhalib.copytask.tasks import CopyTask, distinct_tokens, fixed_offset_task, make_generator, variable_offset_task
from mhalib.copytask.training import evaluate, new_model, steps_to, train

__all__ = [
    "CopyTask",
    "variable_offset_task",
    "fixed_offset_task",
    "make_generator",
    "distinct_tokens",
    "COPY_TASK_CONFIG",
    "PRETRAINED",
    "copy_task_config",
    "load_pretrained",
    "new_model",
    "train",
    "evaluate",
    "steps_to",
]
