"""The widget manager is installed, enabled and in step with ipywidgets.

A mismatch between ipywidgets (kernel side) and its JupyterLab extension (page side)
shows the learner "Error displaying widget: model not found" instead of a slider.
These checks need no browser.
"""

from __future__ import annotations

import json
import re
import sys
from importlib.metadata import requires, version
from pathlib import Path

from lab_harness import WIDGET_MANAGER


def test_widget_manager_is_listed_enabled_and_ok(labextension_list_text):
    text = labextension_list_text
    lines = [line for line in text.splitlines() if WIDGET_MANAGER in line]
    assert lines, f"{WIDGET_MANAGER} missing from `jupyter labextension list`:\n{text}"
    [line] = lines
    assert re.search(r"\benabled\b", line) and re.search(r"\bOK\b", line), line
    # The version listed is the one shipped by the installed jupyterlab_widgets.
    package = Path(sys.prefix, "share/jupyter/labextensions", WIDGET_MANAGER, "package.json")
    shipped = json.loads(package.read_text())["version"]
    assert f"v{shipped}" in line, (line, shipped)


def test_widget_manager_matches_ipywidgets():
    from packaging.requirements import Requirement

    wanted = [Requirement(r) for r in requires("ipywidgets") or []
              if Requirement(r).name.replace("_", "-") == "jupyterlab-widgets"]
    assert wanted, "ipywidgets no longer names jupyterlab_widgets as a dependency"
    installed = version("jupyterlab_widgets")
    assert wanted[0].specifier.contains(installed, prereleases=True), (
        f"ipywidgets {version('ipywidgets')} wants jupyterlab_widgets{wanted[0].specifier}, "
        f"installed {installed}")
