"""JupyterLab in headless Chromium: start a private server, open a notebook, check widgets.

The pieces the browser tests share:

* :func:`find_chromium` locates Debian's Chromium (``apt-get install chromium``);
* :class:`LabServer` runs ``jupyter lab`` on 127.0.0.1 with a free port, a random token
  and its own config, data, runtime and settings directories (no news, no update checks,
  no autosave, every cell kept in the DOM), and stops it together with its kernels;
* :class:`NotebookPage` drives one notebook tab: run all cells, wait for the kernel,
  list the problems a learner would see, and move the explorers' sliders.

A problem is anything a learner should never meet: a traceback in an output, a widget
error ("Error displaying widget: model not found"), or a widget printed as plain text
(``interactive(children=(IntSlider(...``) because the widget manager did not load.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

# Where Debian (and most distributions) put Chromium; $CHROMIUM overrides.
CHROMIUM_CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
HOW_TO_ENABLE = (
    "install Chromium to run them: `sudo apt-get install chromium` (Debian/Ubuntu), "
    "or point $CHROMIUM at a Chromium/Chrome executable"
)

# Headless, and nothing that phones home: with a closed network Chromium's background
# requests (component updates, sync, field trials) would only fail and slow it down.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--metrics-recording-only",
]

WIDGET_MANAGER = "@jupyter-widgets/jupyterlab-manager"
REPO = Path(__file__).resolve().parents[2]

# What a learner must never see in an output.
TRACEBACK_MARKERS = ("Traceback", "Error displaying widget", "model not found",
                     "Error creating widget", "Could not create a view")
# A widget printed as its Python repr: the widget manager did not render it.
WIDGET_AS_TEXT = re.compile(
    r"interactive\(children=|(?:Int|Float|Selection|IntRange|FloatRange)Slider\(|"
    r"[VH]Box\(children=|Output\((?:layout=|outputs=|\))|Dropdown\(|ToggleButtons\(|Button\(description="
)
# An explorer message that names a Python exception other than ValueError is a bug shown
# as text (ValueError is how the library explains an impossible combination).
INTERNAL_ERROR = re.compile(r"\b(?!Value)[A-Z][A-Za-z]*(?:Error|Exception)\b")


def find_chromium() -> str | None:
    """The Chromium executable to drive: ``$CHROMIUM`` if set, else the first on PATH."""
    env = os.environ.get("CHROMIUM")
    if env:
        return env if Path(env).is_file() and os.access(env, os.X_OK) else None
    for name in CHROMIUM_CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


def uses_widgets(path: Path) -> bool:
    """True when a code cell of the notebook mentions ``mhalib.widgets``."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "code":
            src = cell.get("source", "")
            src = "".join(src) if isinstance(src, list) else src
            if "mhalib.widgets" in src or ("from mhalib import" in src and "widgets" in src):
                return True
    return False


def widget_notebooks() -> list[Path]:
    return sorted(p for p in (REPO / "notebooks").glob("*.ipynb") if uses_widgets(p))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_json(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2))


def isolated_jupyter_env(base: Path) -> dict[str, str]:
    """Environment variables that give Jupyter its own config/data/runtime/settings dirs.

    The labextensions and the kernelspec of the virtual environment (``sys.prefix``) stay
    visible: they are the installation under test. Nothing from the user's home is read.
    """
    dirs = {
        "JUPYTER_CONFIG_DIR": base / "config",
        "JUPYTER_DATA_DIR": base / "data",
        "JUPYTER_RUNTIME_DIR": base / "runtime",
        "JUPYTERLAB_SETTINGS_DIR": base / "lab-settings",
        "JUPYTERLAB_WORKSPACES_DIR": base / "lab-workspaces",
        "IPYTHONDIR": base / "ipython",
    }
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    env = {k: str(v) for k, v in dirs.items()}
    env["JUPYTER_PLATFORM_DIRS"] = "1"
    return env


def write_lab_config(env: dict[str, str]) -> None:
    """Server and JupyterLab settings for an unattended, offline, read-only session."""
    config = Path(env["JUPYTER_CONFIG_DIR"])
    _write_json(config / "jupyter_server_config.json", {
        "ServerApp": {"open_browser": False, "terminals_enabled": False,
                      "allow_remote_access": False, "port_retries": 0,
                      # CI containers run as root; the server refuses that unless told.
                      "allow_root": hasattr(os, "geteuid") and os.geteuid() == 0},
        "LabApp": {"news_url": None, "check_for_updates_class": "jupyterlab.NeverCheckForUpdate",
                   "extension_manager": "readonly", "expose_app_in_browser": True},
        "LanguageServerManager": {"autodetect": False},
    })
    settings = Path(env["JUPYTERLAB_SETTINGS_DIR"])
    # No toast asking about news, no update checks, and never write to the notebook.
    _write_json(settings / "@jupyterlab/apputils-extension/notification.jupyterlab-settings",
                {"fetchNews": "false", "checkForUpdates": False, "doNotDisturbMode": True})
    _write_json(settings / "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings",
                {"autosave": False})
    # Every cell stays attached to the DOM, so a scan of the page sees every output.
    _write_json(settings / "@jupyterlab/notebook-extension/tracker.jupyterlab-settings",
                {"windowingMode": "none"})


def _descendants(pid: int) -> list[int]:
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil comes with ipykernel
        return []
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def _kill(pids, sig) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _alive(pid: int) -> bool:
    try:
        import psutil
        return psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except Exception:  # noqa: BLE001
        try:
            os.kill(pid, 0)
            return True
        except OSError:
            return False


class LabServer:
    """A private ``jupyter lab`` for the tests; use as a context manager."""

    def __init__(self, root_dir: Path, base_dir: Path, *, start_timeout: float = 180.0):
        self.root_dir = Path(root_dir)
        self.base_dir = Path(base_dir)
        self.start_timeout = start_timeout
        self.port = free_port()
        self.token = secrets.token_hex(24)
        self.env = isolated_jupyter_env(self.base_dir)
        self.proc: subprocess.Popen | None = None
        self.log_path = self.base_dir / "jupyter-lab.log"
        self.startup_seconds: float | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def api(self, method: str, path: str, timeout: float = 10.0):
        req = urllib.request.Request(f"{self.url}{path}", method=method,
                                     headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            body = resp.read()
        return json.loads(body) if body else None

    def start(self) -> "LabServer":
        write_lab_config(self.env)
        env = {**os.environ, **self.env}
        env.pop("BROWSER", None)
        cmd = [sys.executable, "-m", "jupyterlab",
               "--no-browser", "--ip=127.0.0.1", f"--port={self.port}",
               f"--IdentityProvider.token={self.token}",
               f"--ServerApp.root_dir={self.root_dir}"]
        t0 = time.monotonic()
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, cwd=self.root_dir, env=env, stdout=self._log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        deadline = t0 + self.start_timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                self.api("GET", "/api/status", timeout=5)
                # /lab answers once the lab extension is loaded, not just the server.
                urllib.request.urlopen(f"{self.url}/lab?token={self.token}", timeout=20).read()
                break
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"jupyter lab did not answer within {self.start_timeout:.0f} s:\n"
                                       f"{self.log_tail()}")
                time.sleep(0.5)
        self.startup_seconds = time.monotonic() - t0
        return self

    def shutdown_kernels(self) -> None:
        """Shut every kernel down (sessions first, so the tab does not restart one)."""
        try:
            for s in self.api("GET", "/api/sessions"):
                self.api("DELETE", f"/api/sessions/{s['id']}", timeout=30)
            for k in self.api("GET", "/api/kernels"):
                self.api("DELETE", f"/api/kernels/{k['id']}", timeout=30)
        except Exception:  # noqa: BLE001 - best effort; stop() kills what is left
            pass

    def stop(self) -> None:
        """Stop the server and every process it started (kernels run in their own session)."""
        if self.proc is None:
            return
        self.shutdown_kernels()
        children = _descendants(self.proc.pid)
        if self.proc.poll() is None:
            _kill([self.proc.pid], signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                _kill([self.proc.pid], signal.SIGKILL)
                self.proc.wait(timeout=10)
        _kill([p for p in children if _alive(p)], signal.SIGTERM)
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in children) and time.monotonic() < deadline:
            time.sleep(0.2)
        _kill([p for p in children if _alive(p)], signal.SIGKILL)
        self.proc = None
        self._log.close()

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


class LabextensionList:
    """``jupyter labextension list`` run in the background (it takes seconds to start).

    ``text()`` waits for it and returns what it printed (on stderr), colours removed.
    """

    def __init__(self, env: dict[str, str]):
        # The module itself, not `jupyter labextension`: the `jupyter` command looks its
        # subcommands up on PATH first, where another Python's Jupyter may stand.
        self.proc = subprocess.Popen([sys.executable, "-m", "jupyterlab.labextensions", "list"],
                                     env={**os.environ, **env}, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True)
        self._text: str | None = None

    def text(self, timeout: float = 120.0) -> str:
        if self._text is None:
            try:
                out, _ = self.proc.communicate(timeout=timeout)
            finally:
                self.stop()
            self._text = re.sub(r"\x1b\[[0-9;]*m", "", out or "")
        return self._text

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


# --------------------------------------------------------------------------------------
# In the page


# Returns the problems a learner would see in the notebook's outputs. Each output is
# judged on its own text, without the outputs nested in it (an Output widget inside an
# explorer is an output area of its own), so a report quotes just the faulty part.
_JS_PROBLEMS = r"""
([markers, asText]) => {
  const asTextRe = new RegExp(asText);
  const problems = [];
  const ownText = (el) => {
    const copy = el.cloneNode(true);
    copy.querySelectorAll('.jp-OutputArea-output').forEach((n) => n.remove());
    copy.querySelectorAll('img, canvas, svg, style, script').forEach((n) => n.remove());
    return (copy.textContent || '').replace(/\s+\n/g, '\n').trim();
  };
  const cells = [...document.querySelectorAll('.jp-Notebook .jp-Cell')];
  // Cells tagged raises-exception show their error on purpose (Run All goes on past them).
  const app = window.jupyterapp;
  const models = (app && app.shell.currentWidget && app.shell.currentWidget.content &&
                  app.shell.currentWidget.content.widgets) || [];
  const tags = (i) => (models[i] && models[i].model &&
                       (models[i].model.getMetadata('tags') || [])) || [];
  cells.forEach((cell, i) => {
    const where = `cell ${i + 1}`;
    if (tags(i).includes('raises-exception')) return;
    for (const el of cell.querySelectorAll('.jp-OutputArea-output')) {
      const text = ownText(el);
      const mimeEl = el.hasAttribute('data-mime-type') ? el : el.querySelector('[data-mime-type]');
      const mime = mimeEl ? mimeEl.getAttribute('data-mime-type') : '';
      const marker = markers.find((m) => text.includes(m));
      if (marker) {
        problems.push(`${where}: an output shows "${marker}":\n` + text.slice(-1500));
      } else if (mime !== 'application/vnd.jupyter.stderr' && asTextRe.test(text)) {
        problems.push(`${where}: a widget is shown as plain text, not drawn: ` + text.slice(0, 300));
      }
    }
  });
  return problems;
}
"""

# A short fingerprint of what each explorer shows (images, text), plus its sliders.
_JS_EXPLORERS = r"""
() => {
  const hash = (s) => { let h = 2166136261; for (let i = 0; i < s.length; i++) {
      h ^= s.charCodeAt(i); h = Math.imul(h, 16777619) >>> 0; } return h.toString(16) + ':' + s.length; };
  return [...document.querySelectorAll('.jp-Notebook .mhalib-explorer')].map((ex) => {
    const outs = [...ex.querySelectorAll('.mhalib-explorer-output')];
    const msgs = [...ex.querySelectorAll('.mhalib-explorer-message')];
    const imgs = outs.flatMap((o) => [...o.querySelectorAll('img')].map((im) => im.src));
    const outText = outs.map((o) => o.innerText).join('\n');
    const msgText = msgs.map((m) => m.innerText).join('\n');
    const sliders = [...ex.querySelectorAll('.widget-slider')].map((s) => {
      const h = s.querySelector('.noUi-handle');
      const label = s.querySelector('.widget-label');
      const readout = s.querySelector('.widget-readout');
      return {label: label ? label.innerText.trim() : '',
              value: h ? h.getAttribute('aria-valuenow') : null,
              min: h ? h.getAttribute('aria-valuemin') : null,
              max: h ? h.getAttribute('aria-valuemax') : null,
              readout: readout ? readout.innerText.trim() : '',
              disabled: s.classList.contains('mod-disabled') || !!(h && h.hasAttribute('disabled')),
              hidden: s.offsetParent === null};
    });
    return {signature: hash(imgs.join('|') + '\u0000' + outText + '\u0000' + msgText),
            images: imgs.length, output_text: outText.slice(0, 500), message: msgText.slice(0, 500),
            has_output: outs.length > 0, sliders};
  });
}
"""

_JS_KERNEL = r"""
() => {
  const app = window.jupyterapp;
  const w = app && app.shell.currentWidget;
  const ctx = w && (w.sessionContext || (w.context && w.context.sessionContext));
  const kernel = ctx && ctx.session && ctx.session.kernel;
  const prompts = [...document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputPrompt')]
      .map((p) => p.innerText.trim());
  return {status: kernel ? kernel.status : 'none',
          running: prompts.filter((p) => p.includes('*')).length,
          dialog: !!document.querySelector('.jp-Dialog')};
}
"""


@dataclass
class Move:
    """One slider move and what it did."""

    explorer: int
    label: str
    key: str
    before: str
    after: str
    changed: bool  # the explorer's figure or text differs afterwards
    problems: list
    moved: bool = True  # the control's value differs afterwards


class NotebookPage:
    """One notebook open in JupyterLab, in a Playwright page."""

    def __init__(self, page, server: LabServer, relpath: str):
        self.page = page
        self.server = server
        self.relpath = relpath
        # Errors the page logs: an uncaught exception, or a widget view that failed in
        # JavaScript (which may leave nothing at all in the output to look at).
        self.js_errors: list[str] = []
        page.on("pageerror", lambda exc: self.js_errors.append(f"uncaught error in the page: {exc}"))
        page.on("console", self._on_console)

    def _on_console(self, msg) -> None:
        if msg.type == "error" and re.search(r"widget|model|view", msg.text, re.I):
            self.js_errors.append(f"browser console: {msg.text[:500]}")

    # ---- opening and running

    def open(self, timeout: float = 120.0, *, wait_for_kernel: bool = True) -> "NotebookPage":
        """Open the notebook; ``wait_for_kernel=False`` returns once its cells are drawn
        (for checks of the stored notebook, which need no kernel)."""
        url = f"{self.server.url}/lab/tree/{self.relpath}?token={self.server.token}&reset"
        self.page.goto(url, timeout=timeout * 1000, wait_until="domcontentloaded")
        self.page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=timeout * 1000)
        self.page.wait_for_function("() => !!window.jupyterapp", timeout=timeout * 1000)
        # More room for the notebook in screenshots: fold the file browser away.
        self.page.evaluate("() => window.jupyterapp.shell.collapseLeft()")
        if wait_for_kernel:
            self.wait_kernel_idle(timeout)
        self.fail_on_dialog()
        return self

    def fail_on_dialog(self) -> None:
        """A dialog (e.g. 'Select Kernel') would wait for a click forever: report it."""
        dialog = self.page.locator(".jp-Dialog")
        if dialog.count():
            raise AssertionError(f"{self.relpath}: JupyterLab shows a dialog: "
                                 f"{dialog.first.inner_text()[:500]}")

    def kernel_state(self) -> dict:
        return self.page.evaluate(_JS_KERNEL)

    def wait_kernel_idle(self, timeout: float = 120.0, settle: float = 0.6) -> None:
        """Wait until the kernel is idle and no cell is queued, and stays so for ``settle`` s."""
        deadline = time.monotonic() + timeout
        quiet_since = None
        state = {}
        while time.monotonic() < deadline:
            state = self.kernel_state()
            if state["dialog"]:
                self.fail_on_dialog()
            if state["status"] == "idle" and state["running"] == 0:
                quiet_since = quiet_since or time.monotonic()
                if time.monotonic() - quiet_since >= settle:
                    return
            else:
                quiet_since = None
            time.sleep(0.1)
        raise AssertionError(f"{self.relpath}: kernel not idle after {timeout:.0f} s: {state}")

    def menu(self, menu: str, item: str) -> None:
        """Click ``menu`` in the menu bar, then ``item`` (as a learner would)."""
        self.page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(f"^{re.escape(menu)}$")).click()
        self.page.locator(".lm-Menu-item:not(.lm-mod-disabled) .lm-Menu-itemLabel",
                          has_text=re.compile(f"^{re.escape(item)}$")).first.click()

    def run_all(self, timeout: float = 300.0) -> float:
        """Clear every output, run all cells from the Run menu, wait for the kernel.

        Clearing first removes the outputs stored in the file (whose widgets cannot be
        shown without their kernel), so every output checked afterwards is fresh.
        Returns the seconds the run took.
        """
        self.page.evaluate("() => window.jupyterapp.commands.execute('notebook:clear-all-cell-outputs')")
        self.page.wait_for_function(
            "() => [...document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputPrompt')]"
            ".every((p) => !/\\d/.test(p.innerText))", timeout=30_000)
        t0 = time.monotonic()
        self.menu("Run", "Run All Cells")
        # Run All marks every code cell as queued at once; wait for a number or a '*'.
        self.page.wait_for_function(
            "() => [...document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputPrompt')]"
            ".some((p) => /[\\d*]/.test(p.innerText))", timeout=60_000)
        self.wait_kernel_idle(timeout, settle=1.0)
        self.wait_widgets_rendered()
        return time.monotonic() - t0

    def wait_widgets_rendered(self, timeout: float = 30.0) -> None:
        """Wait until no output says 'Loading widget...' any more."""
        self.page.wait_for_function(
            "() => ![...document.querySelectorAll('.jp-Notebook .jp-OutputArea-output')]"
            ".some((o) => (o.innerText || '').trim() === 'Loading widget...')",
            timeout=timeout * 1000)

    # ---- what is on screen

    def problems(self) -> list[str]:
        found = self.page.evaluate(_JS_PROBLEMS, [list(TRACEBACK_MARKERS), WIDGET_AS_TEXT.pattern])
        return found + self.js_errors

    def explorers(self) -> list[dict]:
        return self.page.evaluate(_JS_EXPLORERS)

    def explorer_problems(self) -> list[str]:
        """Explorers that show nothing, or a message naming an exception (a hidden bug)."""
        found = []
        for i, ex in enumerate(self.explorers()):
            if not ex["has_output"]:
                found.append(f"explorer {i + 1} has no element with class mhalib-explorer-output")
            elif not (ex["images"] or ex["output_text"].strip() or ex["message"].strip()):
                found.append(f"explorer {i + 1} shows neither a figure nor a message")
            if INTERNAL_ERROR.search(ex["message"] + "\n" + ex["output_text"]):
                found.append(f"explorer {i + 1} reports an internal error: {ex['message'][:300]}")
        return found

    def all_problems(self) -> list[str]:
        return self.problems() + self.explorer_problems()

    def screenshot(self, path: Path, explorer: int | None = None, *,
                   max_height: int = 16_000) -> Path:
        """The whole notebook as one tall image, or one explorer (``explorer`` index)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        if explorer is not None:
            loc = self.page.locator(".jp-Notebook .mhalib-explorer").nth(explorer)
            loc.scroll_into_view_if_needed()
            loc.screenshot(path=str(path))
            return path
        # Grow the window to the notebook's height so that one image shows every cell.
        height = self.page.evaluate(
            "() => Math.max(0, ...[...document.querySelectorAll("
            "'.jp-NotebookPanel:not(.lm-mod-hidden) .jp-WindowedPanel-outer, "
            ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook')].map((e) => e.scrollHeight))")
        viewport = self.page.viewport_size
        tall = min(max(viewport["height"], height + 200), max_height)
        try:
            self.page.set_viewport_size({"width": viewport["width"], "height": tall})
            # Run All leaves the notebook scrolled to its end: start from the top.
            self.page.evaluate(
                "() => document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) "
                ".jp-WindowedPanel-outer').forEach((e) => { e.scrollTop = 0; })")
            self.page.wait_for_timeout(500)
            self.page.screenshot(path=str(path))
        finally:
            self.page.set_viewport_size(viewport)
        return path

    # ---- sliders

    def _handle(self, explorer: int, slider: int):
        ex = self.page.locator(".jp-Notebook .mhalib-explorer").nth(explorer)
        return ex.locator(".widget-slider").nth(slider).locator(".noUi-handle").first

    def press(self, explorer: int, slider: int, key: str, *, expect_change: bool,
              timeout: float = 60.0) -> Move:
        """Press ``key`` on a slider's handle; wait for the explorer to redraw and settle."""
        before_ex = self.explorers()[explorer]
        before = before_ex["signature"]
        label = before_ex["sliders"][slider]["label"]
        value_before = before_ex["sliders"][slider]["value"]
        shown_before = before_ex["sliders"][slider]["readout"] or value_before
        handle = self._handle(explorer, slider)
        handle.scroll_into_view_if_needed()
        handle.focus()
        handle.press(key)
        value_after = self.explorers()[explorer]["sliders"][slider]["value"]
        now = self._wait_redraw(explorer, before, value_after != value_before, timeout)
        shown_after = now["sliders"][slider]["readout"] or value_after
        move = Move(explorer, label, key, f"{label}={shown_before}", f"{label}={shown_after}",
                    now["signature"] != before, self.all_problems(),
                    moved=value_after != value_before)
        if expect_change and value_after == value_before:
            raise AssertionError(f"{self.relpath}: pressing {key} on slider {label!r} "
                                 f"(explorer {explorer + 1}) did not move it from {value_before}")
        return move

    def _wait_redraw(self, explorer: int, before: str, moved: bool, timeout: float) -> dict:
        """After a control changed, wait for the explorer to redraw and the kernel to settle."""
        deadline = time.monotonic() + timeout
        if moved:  # the kernel must redraw (busy, then idle)
            idle_since, seen_busy = None, False
            while time.monotonic() < deadline:
                if self.explorers()[explorer]["signature"] != before:
                    break
                # A kernel that handled the move (busy, then idle for a while), or that
                # stayed idle for many seconds, has nothing more to draw: the redraw
                # failed silently. Stop waiting; the caller reports it.
                idle = self.kernel_state()["status"] == "idle"
                seen_busy = seen_busy or not idle
                idle_since = (idle_since or time.monotonic()) if idle else None
                quiet = time.monotonic() - idle_since if idle_since else 0.0
                if (seen_busy and quiet > 2.0) or quiet > 8.0:
                    break
                time.sleep(0.1)
        self.wait_kernel_idle(max(5.0, deadline - time.monotonic()), settle=0.25)
        self.wait_widgets_rendered()
        return self.explorers()[explorer]

    def use_other_controls(self, explorer: int, timeout: float = 60.0) -> list[Move]:
        """Toggle each checkbox, pick another option in each drop-down, click each button.

        Sliders are the main subject; these are used once each, checking only that
        nothing breaks (a button may legitimately leave the figure as it was).
        """
        moves = []
        box = self.page.locator(".jp-Notebook .mhalib-explorer").nth(explorer)
        controls = [(".widget-checkbox input[type=checkbox]", "check"),
                    (".widget-dropdown select", "select"),
                    ("button.jupyter-button", "click")]
        for selector, how in controls:
            for k in range(box.locator(selector).count()):
                el = box.locator(selector).nth(k)
                # Only the explorer's own controls, not widgets inside its output, and only
                # those a learner can reach now (not another mode's hidden ones).
                if el.evaluate("(e) => !!e.closest('.mhalib-explorer-output') || e.disabled || !e.offsetParent"):
                    continue
                before = self.explorers()[explorer]["signature"]
                el.scroll_into_view_if_needed()
                if how == "check":
                    name = " ".join(el.evaluate(
                        "(e) => (e.closest('.widget-checkbox') || e).innerText")
                        .replace("\u200b", " ").split()) or "checkbox"
                    was = el.is_checked()
                    el.click()
                    what = (f"{name}={'on' if was else 'off'}", f"{name}={'off' if was else 'on'}")
                elif how == "select":
                    options = el.evaluate("(e) => [...e.options].map((o) => o.value)")
                    if len(options) < 2:
                        continue
                    was = el.input_value()
                    new = options[(options.index(was) + 1) % len(options)] if was in options else options[0]
                    el.select_option(new)
                    name = el.evaluate("(e) => { const l = e.closest('.widget-dropdown')"
                                       ".querySelector('.widget-label'); return l ? l.innerText.trim() : ''; }")
                    what = (f"{name}={was}", f"{name}={new}")
                else:
                    name = el.inner_text().strip() or el.get_attribute("title") or "button"
                    el.click()
                    what = (f"button {name}", "clicked")
                now = self._wait_redraw(explorer, before, False, timeout)
                moves.append(Move(explorer, name, how, what[0], what[1],
                                  now["signature"] != before, self.all_problems()))
        return moves


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


@dataclass
class NotebookReport:
    """What :func:`check_notebook` did: run time, explorers, slider moves, screenshots."""

    relpath: str
    run_seconds: float = 0.0
    explorers: int = 0
    moves: list = None
    screenshots: list = None

    def summary(self) -> str:
        lines = [f"{self.relpath}: run all {self.run_seconds:.1f} s, {self.explorers} explorer(s), "
                 f"{len(self.moves)} move(s)"]
        lines += [f"  explorer {m.explorer + 1}: {m.key:10s} {m.before} -> {m.after}"
                  f" ({'redrawn' if m.changed else 'unchanged'})" for m in self.moves]
        return "\n".join(lines)


# Keys pressed on each slider, in order; the first must move it and redraw the figure.
# "far" is End (Home when the slider starts at its maximum). Ending two steps above the
# minimum leaves an odd value (e.g. H = 3) while the next slider visits its ends.
FULL_PLAN = ("far", "Home", "ArrowRight", "ArrowRight")
QUICK_PLAN = ("ArrowRight",)


def check_notebook(nb: NotebookPage, shots: Path, *, require_explorer: bool = True,
                   plan: tuple = FULL_PLAN, other_controls: bool = True) -> NotebookReport:
    """Everything a learner does with a notebook's widgets, checked as they go.

    Run all cells; no output may show a traceback, a widget error or a widget as text;
    at least one explorer must be drawn. Then, for every slider of every explorer:
    the far end (End), the near end (Home) and two arrow steps up from there (``plan``),
    checking after each move that nothing broke and that the figure or its text changed.
    Ending each slider two steps above its minimum leaves it at an odd value (e.g.
    H = 3) while the next slider visits its ends (e.g. d_model = 8). Then each
    checkbox, drop-down and button of the explorer is used once (``other_controls``).
    Screenshots go to ``shots``: the notebook after Run All, each explorer before its
    sliders move and after its first move, and the page at the moment of a failure.
    """
    stem = Path(nb.relpath).stem
    report = NotebookReport(nb.relpath, moves=[], screenshots=[])

    def fail(msg: str, explorer: int | None = None):
        shot = nb.screenshot(shots / f"{stem}-FAILED.png")
        report.screenshots.append(shot)
        if explorer is not None:
            shot = nb.screenshot(shots / f"{stem}-FAILED-explorer{explorer + 1}.png", explorer)
            report.screenshots.append(shot)
        raise AssertionError(f"{nb.relpath}: {msg}\n(screenshot: {shot})\n{report.summary()}")

    report.run_seconds = nb.run_all()
    report.screenshots.append(nb.screenshot(shots / f"{stem}-run-all.png"))
    problems = nb.all_problems()
    if problems:
        fail("after Run All Cells:\n" + "\n".join(problems))
    explorers = nb.explorers()
    report.explorers = len(explorers)
    if require_explorer and not explorers:
        fail("the notebook uses mhalib.widgets but no element with class 'mhalib-explorer' "
             "was drawn after Run All Cells")
    for i, ex in enumerate(explorers):
        report.screenshots.append(nb.screenshot(shots / f"{stem}-explorer{i + 1}-run-all.png", i))
        for j, sl in enumerate(ex["sliders"]):
            if sl["disabled"] or sl.get("hidden") or sl["value"] is None:
                continue  # a learner cannot move a disabled or hidden slider (e.g. another mode's)
            name = _slug(sl["label"]) or f"slider{j + 1}"
            at_max = sl["value"] == sl["max"]
            keys = [("Home" if at_max else "End") if k == "far" else k for k in plan]
            if at_max and keys[:2] == ["Home", "Home"]:
                del keys[1]  # it starts at the far end: one move takes it home
            if at_max and keys[0] == "ArrowRight":
                keys[0] = "ArrowLeft"  # the first move must move it
            for n, key in enumerate(keys):
                is_first = n == 0
                move = nb.press(i, j, key, expect_change=is_first)
                report.moves.append(move)
                if is_first:
                    report.screenshots.append(
                        nb.screenshot(shots / f"{stem}-explorer{i + 1}-{name}-moved.png", i))
                if move.problems:
                    fail(f"after moving {move.before} -> {move.after} ({key}) in explorer {i + 1}:\n"
                         + "\n".join(move.problems), i)
                # Every slider position shows its own figure or words (a message names
                # the values it refuses), so a move that changes nothing failed silently.
                if move.moved and not move.changed:
                    fail(f"moving {move.before} -> {move.after} ({key}) in explorer {i + 1} did not "
                         "change its figure or text (a redraw that failed silently?)", i)
        if other_controls:
            for move in nb.use_other_controls(i):
                report.moves.append(move)
                if move.problems:
                    fail(f"after {move.key} {move.before} -> {move.after} in explorer {i + 1}:\n"
                         + "\n".join(move.problems), i)
    return report
