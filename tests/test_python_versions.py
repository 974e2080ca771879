"""Every supported Python resolves the pinned set.

For each Python that requires-python admits (3.10 to 3.13), pip's own resolver runs with
that interpreter (`pip install --dry-run --ignore-installed --report`: nothing is
installed) on the package's dependencies, the dev extra included, constrained by
requirements/lock.txt, and must pick exactly the pinned versions. The four resolutions
run side by side, with pip 25.3 or later: older ones download every whole wheel on a dry
run (gigabytes, with PyPI's CUDA torch). Wheel metadata is read with range requests
(fast-deps) where the index does not serve it apart; a dry run that starts downloading a
large wheel all the same is stopped and fails.

An interpreter is looked up as `python3.N` on PATH, then in pyenv's versions. A missing
one is skipped, saying so, except under CI (the variable CI set), where it fails. An
unreachable package index skips the resolution.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from test_repository import ROOT, canonical, lock_lines, pyproject, supported_pythons

LOCK = ROOT / "requirements" / "lock.txt"
# Not pinned on purpose: pip's own tools, and the CUDA libraries that PyPI's Linux torch
# wheel (the CUDA build) pulls in where PyTorch's CPU wheel is not at hand.
UNPINNED = re.compile(r"^(pip|setuptools|wheel|triton|nvidia-.*|cuda-.*)$")
BIG_DOWNLOAD = re.compile(r"Downloading (\S+\.whl) \(([\d.]+) (MB|GB)\)")
NETWORK_TROUBLE = (
    "NewConnectionError",
    "Temporary failure in name resolution",
    "Name or service not known",
    "Failed to establish a new connection",
    "Connection refused",
    "ConnectTimeoutError",
    "ReadTimeoutError",
    "ProxyError",
    "Max retries exceeded",
    "Network is unreachable",
)


def in_ci():
    return bool(os.environ.get("CI"))


def pyenv_roots():
    roots = [os.environ.get("PYENV_ROOT")]
    if shutil.which("pyenv"):
        found = subprocess.run(["pyenv", "root"], capture_output=True, text=True)
        roots.append(found.stdout.strip() if found.returncode == 0 else None)
    roots.append(str(Path.home() / ".pyenv"))
    return [Path(r) for r in dict.fromkeys(r for r in roots if r)]


def patch_level(path):
    return tuple(int(p) if p.isdigit() else -1 for p in path.parent.parent.name.split("."))


def find_python(minor):
    """An interpreter for Python `minor` ("3.10"), or None."""
    candidates = [shutil.which(f"python{minor}")]
    for root in pyenv_roots():
        candidates += sorted((root / "versions").glob(f"{minor}.*/bin/python{minor}"), key=patch_level, reverse=True)
    for exe in filter(None, candidates):
        try:
            said = subprocess.run([str(exe), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                  capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if said.returncode == 0 and said.stdout.strip() == minor:
            return str(exe)
    return None


def requirements():
    project = pyproject()["project"]
    return project["dependencies"] + project["optional-dependencies"]["dev"]


def resolve(minor, exe, pip_wheel, workdir):
    """Run pip's resolution with `exe`; returns a dict with the outcome and its wall time."""
    start = time.monotonic()
    venv, report = workdir / f"venv{minor}", workdir / f"report{minor}.json"
    made = subprocess.run([exe, "-m", "venv", "--without-pip", str(venv)], capture_output=True, text=True)
    if made.returncode != 0:
        return {"minor": minor, "error": f"`{exe} -m venv` failed:\n{made.stderr[-2000:]}", "seconds": time.monotonic() - start}
    command = [str(venv / "bin" / "python"), str(pip_wheel / "pip"), "install", "--disable-pip-version-check",
               "--no-input", "--dry-run", "--ignore-installed", "--only-binary=:all:", "--use-feature=fast-deps",
               "--retries", "2", "--timeout", "30", "--report", str(report), "-c", str(LOCK), *requirements()]
    lines, too_big = [], None
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=workdir) as pip:
        for line in pip.stdout:
            lines.append(line)
            big = BIG_DOWNLOAD.search(line)
            if big and float(big.group(2)) * (1000 if big.group(3) == "GB" else 1) >= 50:
                # A dry run needs metadata, never a whole large wheel.
                too_big = f"pip began downloading a whole wheel for a dry run: {big.group(1)} ({big.group(2)} {big.group(3)})"
                pip.kill()
                break
        returncode = pip.wait()
    outcome = {"minor": minor, "python": exe, "rc": returncode, "output": "".join(lines), "seconds": time.monotonic() - start}
    if too_big:
        outcome["error"] = too_big
    elif returncode == 0:
        outcome["report"] = json.loads(report.read_text())
    return outcome


@pytest.fixture(scope="module")
def pip_wheel(tmp_path_factory):
    """A pip that reads metadata without downloading whole wheels on --dry-run (25.3 and
    later), unpacked nowhere: Python runs pip straight from its wheel."""
    folder = tmp_path_factory.mktemp("pip")
    got = subprocess.run([sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--no-deps",
                          "--only-binary=:all:", "--retries", "2", "--timeout", "30", "-d", str(folder), "pip>=25.3"],
                         capture_output=True, text=True)
    if got.returncode != 0:
        trouble = [line for line in (got.stdout + got.stderr).splitlines() if any(s in line for s in NETWORK_TROUBLE)]
        if trouble:
            pytest.skip(f"the package index is not reachable (pip: {trouble[0].strip()[:200]})")
        pytest.fail(f"could not download pip>=25.3 to run the resolutions:\n{got.stderr[-2000:]}")
    return next(folder.glob("pip-*.whl"))


@pytest.fixture(scope="module")
def interpreters():
    return {minor: find_python(minor) for minor in supported_pythons()}


@pytest.mark.parametrize("minor", supported_pythons())
def test_each_supported_python_is_found(minor, interpreters):
    if interpreters[minor] is None:
        message = (f"no Python {minor} found (looked for python{minor} on PATH and in pyenv's versions); "
                   f"install it to prove the pins resolve on it")
        if in_ci():
            pytest.fail(message + " (CI is set: every supported Python must be present)")
        pytest.skip(message)


def lock_pin_for(name, environment):
    """The lock's (version, marker) for `name` under `environment`, or None."""
    matches = [(v, m) for n, v, m in lock_lines() if n == name and (m is None or m.evaluate(environment))]
    assert len(matches) <= 1, f"requirements/lock.txt has {len(matches)} pins of {name} for one Python"
    return matches[0] if matches else None


def check_report(minor, report):
    """Problems with one resolution: a pinned package at another version, an unpinned one."""
    environment = report["environment"]
    lowest = dict(environment, python_full_version=f"{minor}.0")
    problems = []
    for item in report["install"]:
        meta = item["metadata"]
        name, version = canonical(meta["name"]), Version(meta["version"])
        pin = lock_pin_for(name, environment)
        if pin is None:
            if not UNPINNED.match(name):
                problems.append(f"{name}=={version} is picked but not pinned in requirements/lock.txt")
            continue
        if version.public != pin[0]:
            problems.append(f"{name}: picked {version}, pinned {pin[0]}")
        # The pin must also hold on the oldest patch release of this Python that uses it.
        requires = meta.get("requires_python")
        if requires and (pin[1] is None or pin[1].evaluate(lowest)) and f"{minor}.0" not in SpecifierSet(requires):
            problems.append(f"{name}=={pin[0]} needs Python {requires}: Python {minor}.0 would fail; "
                            f"give it a python_full_version marker")
    return problems


@pytest.mark.network
def test_every_supported_python_resolves_the_pinned_versions(interpreters, pip_wheel, tmp_path):
    found = {minor: exe for minor, exe in interpreters.items() if exe}
    if not found:
        pytest.skip("no supported Python found: see test_each_supported_python_is_found")
    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=len(found)) as pool:
        outcomes = list(pool.map(lambda item: resolve(*item, pip_wheel, tmp_path), found.items()))
    wall = time.monotonic() - start
    timings = ", ".join(f"{o['minor']}: {o['seconds']:.0f} s" for o in outcomes)
    print(f"\n{pip_wheel.name}: resolutions side by side in {wall:.0f} s ({timings})")

    unreachable = [o for o in outcomes if o.get("rc") and any(s in o.get("output", "") for s in NETWORK_TROUBLE)]
    if unreachable and len(unreachable) == len(outcomes):
        pytest.skip("the package index is not reachable (pip: "
                    + next(line for line in unreachable[0]["output"].splitlines() if any(s in line for s in NETWORK_TROUBLE)).strip()[:200] + ")")
    failures = []
    for o in outcomes:
        if "error" in o:
            failures.append(f"Python {o['minor']}: {o['error']}")
        elif o["rc"] != 0:
            tail = "\n".join(o["output"].strip().splitlines()[-15:])
            failures.append(f"Python {o['minor']} ({o['python']}): pip's resolution failed:\n{tail}")
        else:
            failures += [f"Python {o['minor']}: {p}" for p in check_report(o["minor"], o["report"])]
    assert not failures, "\n".join(failures)
