"""The course's JupyterLab extension (``labextension/``) is installed, enabled and running.

It gives each figure of a notebook its alternative text and names what JupyterLab leaves
unnamed (see ``test_lab_a11y.py``). The set-up (``make lab``, ``make test``) installs it,
prebuilt, with pip (``pip install ./labextension``); an install older than the build in
``labextension/mha-course-a11y/`` would show the learners the old one.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from a11y import COURSE_LABEXTENSION, COURSE_PLUGIN
from lab_harness import REPO, NotebookPage

SOURCE = REPO / "labextension"
BUILT = SOURCE / COURSE_LABEXTENSION
INSTALLED = Path(sys.prefix, "share", "jupyter", "labextensions", COURSE_LABEXTENSION)
HOW_TO_INSTALL = "run make lab or make test (their set-up runs pip install ./labextension)"


def files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_the_built_extension_is_committed_and_matches_its_package_json():
    built = json.loads((BUILT / "package.json").read_text())
    source = json.loads((SOURCE / "package.json").read_text())
    # The build copies package.json and adds where its code is; a change of name, version
    # or dependencies without a rebuild leaves them apart.
    assert {k: v for k, v in built.items() if k != "jupyterlab"} == {k: v for k, v in source.items()
                                                                       if k != "jupyterlab"}
    load = built["jupyterlab"]["_build"]["load"]
    assert (BUILT / load).is_file(), f"{BUILT / load} is missing: rebuild (cd labextension && npm ci && npm run build)"


def test_the_installed_extension_is_the_one_built_here():
    assert INSTALLED.is_dir(), f"{COURSE_LABEXTENSION} is not installed in {sys.prefix}: {HOW_TO_INSTALL}"
    installed, built = files(INSTALLED), files(BUILT)
    installed.pop("install.json", None)
    assert installed.keys() == built.keys(), f"installed {sorted(installed)}, built {sorted(built)}: {HOW_TO_INSTALL}"
    stale = [name for name in built if installed[name] != built[name]]
    assert not stale, f"the installed {stale} differ from labextension/: {HOW_TO_INSTALL}"


def test_the_extension_is_listed_enabled_and_ok(labextension_list_text):
    text = labextension_list_text
    lines = [line for line in text.splitlines() if re.search(rf"\b{re.escape(COURSE_LABEXTENSION)}\b", line)]
    assert lines, f"{COURSE_LABEXTENSION} missing from `jupyter labextension list` ({HOW_TO_INSTALL}):\n{text}"
    [line] = lines
    assert re.search(r"\benabled\b", line) and re.search(r"\bOK\b", line), line
    version = json.loads((BUILT / "package.json").read_text())["version"]
    assert f"v{version}" in line, (line, version)


@pytest.mark.browser
def test_the_plugin_runs_in_jupyterlab(lab_page, lab_server):
    NotebookPage(lab_page, lab_server, "fixtures/tiny_explorer.ipynb").open(wait_for_kernel=False)
    assert lab_page.evaluate("(id) => window.jupyterapp.hasPlugin(id) && window.jupyterapp.isPluginActivated(id)",
                             COURSE_PLUGIN)
