"""Fixtures for the browser tests: one private JupyterLab, one headless Chromium.

Without Chromium (or Playwright) the tests are skipped with a message saying how to
enable them, unless the environment variable ``CI`` is set: there their absence is a
failure, so a CI image that lost its browser cannot pass silently.

Screenshots land in ``artifacts/screenshots/`` (ignored by git).

The accessibility tests also need axe-core (``.venv/axe/``, installed by ``make test``
with npm; see ``a11y.py``): without it they are skipped, or fail when ``CI`` is set.
Their results, violations per page by impact, are printed at the end of the run.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from lab_harness import (CHROMIUM_ARGS, HOW_TO_ENABLE, REPO, LabextensionList, LabServer,
                         find_chromium, isolated_jupyter_env)

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SCREENSHOTS = REPO / "artifacts" / "screenshots"
VIEWPORT = {"width": 1280, "height": 900}


_BACKGROUND: dict = {}


def pytest_collection_finish(session):
    """Start `jupyter labextension list` now; its test collects the output later."""
    if any("test_browser_labextension" in item.nodeid for item in session.items):
        tmp = tempfile.TemporaryDirectory(prefix="labextension-list-")
        _BACKGROUND["tmp"] = tmp
        _BACKGROUND["labextension_list"] = LabextensionList(isolated_jupyter_env(Path(tmp.name)))


def pytest_sessionfinish(session):
    job = _BACKGROUND.pop("labextension_list", None)
    if job is not None:
        job.stop()
    tmp = _BACKGROUND.pop("tmp", None)
    if tmp is not None:
        tmp.cleanup()


@pytest.fixture(scope="session")
def labextension_list_text(tmp_path_factory) -> str:
    """What `jupyter labextension list` prints, with the isolated Jupyter dirs."""
    job = _BACKGROUND.get("labextension_list") or LabextensionList(
        isolated_jupyter_env(tmp_path_factory.mktemp("labextension-list")))
    return job.text()


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def unavailable(reason: str):
    """Skip (on a developer's machine) or fail (in CI) for a missing browser stack."""
    if in_ci():
        pytest.fail(f"{reason}. CI is set, so the browser tests must run: {HOW_TO_ENABLE}",
                    pytrace=False)
    pytest.skip(f"browser tests skipped: {reason}; {HOW_TO_ENABLE}")


@pytest.fixture(scope="session")
def chromium_path() -> str:
    path = find_chromium()
    if path is None:
        unavailable("Chromium was not found" + (f" at $CHROMIUM={os.environ['CHROMIUM']}"
                                                if os.environ.get("CHROMIUM") else " on PATH"))
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        unavailable("Playwright for Python is not installed (pip install -e '.[dev]')")
    return path


@pytest.fixture(scope="session")
def lab_root(tmp_path_factory) -> Path:
    """The folder JupyterLab serves: copies of notebooks/ and of the harness fixtures.

    Copies, so that nothing a test does (even a save) can touch the committed notebooks.
    """
    root = tmp_path_factory.mktemp("lab-root")
    ignore = shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__")
    shutil.copytree(REPO / "notebooks", root / "notebooks", ignore=ignore)
    shutil.copytree(FIXTURES, root / "fixtures", ignore=ignore)
    return root


@pytest.fixture(scope="session")
def lab_server(chromium_path, lab_root, tmp_path_factory):
    """``jupyter lab`` on 127.0.0.1, a free port, a random token, isolated Jupyter dirs."""
    server = LabServer(lab_root, tmp_path_factory.mktemp("jupyter"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def browser(chromium_path):
    from playwright.sync_api import sync_playwright

    pw = sync_playwright().start()
    try:
        chromium = pw.chromium.launch(executable_path=chromium_path, args=CHROMIUM_ARGS,
                                      headless=True, timeout=120_000)
    except Exception:
        pw.stop()
        raise
    try:
        yield chromium
    finally:
        chromium.close()
        pw.stop()


@pytest.fixture
def lab_page(browser, lab_server):
    """A fresh browser tab; its kernels are shut down afterwards."""
    context = browser.new_context(viewport=VIEWPORT)
    context.set_default_timeout(60_000)
    page = context.new_page()
    try:
        yield page
    finally:
        context.close()
        lab_server.shutdown_kernels()


@pytest.fixture(scope="session")
def axe(chromium_path) -> str:
    """The source of axe-core's axe.min.js (skipped, or failed in CI, when it is missing)."""
    from a11y import HOW_TO_INSTALL_AXE, axe_path, axe_source

    source = axe_source()
    if source is None:
        reason = f"axe-core was not found at {axe_path()}"
        if in_ci():
            pytest.fail(f"{reason}. CI is set, so the accessibility checks must run: {HOW_TO_INSTALL_AXE}",
                        pytrace=False)
        pytest.skip(f"accessibility checks skipped: {reason}; {HOW_TO_INSTALL_AXE}")
    return source


@pytest.fixture(scope="session")
def site(tmp_path_factory):
    """The course site, built afresh from the working tree: ``(folder, pages)``."""
    import sys

    sys.path.insert(0, str(REPO / "tools"))
    import build_site

    out = tmp_path_factory.mktemp("site") / "site"
    pages = build_site.build(out)
    return out, pages


_A11Y_REPORT: list = []


@pytest.fixture(scope="session")
def a11y_report() -> list:
    """Append ``(what, {impact: failing elements})``; printed at the end of the run."""
    return _A11Y_REPORT


def pytest_terminal_summary(terminalreporter):
    if not _A11Y_REPORT:
        return
    terminalreporter.section("axe-core (WCAG 2.1 A and AA): failing elements by impact")
    for what, counts in _A11Y_REPORT:
        shown = ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"
        terminalreporter.write_line(f"{what}: {shown}")


@pytest.fixture(scope="session")
def screenshots() -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    return SCREENSHOTS
