"""One attack per root cause the grader's review found, each a fixture notebook in
tests/fixtures/grader/attack_N_*.ipynb, graded under the same sandbox as a class run.

1 silent privilege fallback      2 forbidden calls checked inside the student's process
3 no isolation between submissions   4 hangs   5 the results file   6 the student chooses
the exercise   7 honest answers marked wrong   8 internal errors from the child   9 report flood
10 forged replies   11 no wall clock over a submission   12 the sandbox's view of the grader
(environment, other processes, writable places)   13 a syntax error reported as a missing
function   14 kernel interfaces (keyrings, tracing, namespaces, eBPF, io_uring, mounts)   15 memory
and processes counted per process instead of per submission   16 the submission's notebook read,
converted and compiled in the grader's own process   17 processes that outlive a killed grader
18 no CPU share per submission   19 socket families that reach outside the sandbox. Without a
notebook of their own: links and special files as submissions, CSV cells read as formulas,
and grading without a sandbox (--no-isolation).

Placeholders in a fixture (``@NAME@``) are filled in here with paths of this run.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
import zipfile
from pathlib import Path

import numpy as np
import pytest

from mhalib.grade import cgroup, seccomp, worker
from mhalib.grade.__main__ import csv_cell
from mhalib.grade.grader import NotebookError, NotRegularFile, grade_notebook, read_submission
from mhalib.grade.sandbox import Isolation, Limits, _bwrap_has, decide

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "grader"
SOLUTION_01 = ROOT / "solutions" / "01_single_head_attention.ipynb"
FAST = Limits(call_timeout_s=6, cell_timeout_s=15)
MASK, SDPA = "causal_mask", "scaled_dot_product_attention"


def fixture(tmp_path, name, target=None, **fill):
    """The fixture ``name`` with its placeholders filled in, written to ``target``."""
    text = (FIXTURES / f"{name}.ipynb").read_text(encoding="utf-8")
    for key, value in fill.items():
        text = text.replace(f"@{key}@", json.dumps(str(value))[1:-1])
    path = Path(target or tmp_path / f"{name}.ipynb")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def by_name(result):
    return {c.name: c for c in result.checks}


def grade_cli(*args, cwd, env=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "mhalib.grade", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def processes_with(marker):
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            pass
    return found


def test_every_root_cause_has_its_attack_fixture():
    fixtures = sorted(p.stem for p in FIXTURES.glob("attack_*.ipynb"))
    assert sorted(int(name.split("_")[1]) for name in fixtures) == list(range(1, 20))
    source = Path(__file__).read_text(encoding="utf-8")
    assert all(name in source for name in fixtures)


def test_ci_grades_under_bubblewrap():
    """CI runs these attacks in the sandbox a class run uses (.ci/run installs bubblewrap)."""
    isolation = decide()
    if not os.environ.get("CI") and not isolation.ok:
        pytest.skip(f"no sandbox here: {isolation.problem}")
    assert isolation.kind == "bubblewrap", isolation.problem


# ----------------------------------------------------------------------------- 1
def test_1_student_code_never_runs_with_the_graders_rights(tmp_path):
    """A helper kills every process it sees (the child too, and would kill its next start);
    the next start is as isolated as the first, and nothing the code writes lands in the
    course, the environment or the results. Where the child is PID 1 of its namespace, the
    helper's signals cannot kill it: no cell is skipped."""
    site = Path(np.__file__).resolve().parents[1]
    planted = [ROOT / "mhalib" / "grade" / f"zz_{uuid.uuid4().hex}.py", site / f"zz_{uuid.uuid4().hex}.pth",
               tmp_path / "results.json"]
    nb = fixture(tmp_path, "attack_1_privileges", COURSE_FILE=planted[0], PTH_FILE=planted[1],
                 RESULTS_FILE=planted[2])
    result = grade_notebook(nb, limits=FAST, seed=1)
    assert [p for p in planted if p.exists()] == []
    checks = by_name(result)
    assert checks[MASK].score == checks[MASK].max_score, result.text()  # not root, nothing planted
    assert checks[MASK + " (n < 1)"].score == checks[MASK + " (n < 1)"].max_score, result.text()
    assert checks[SDPA].score == checks[SDPA].max_score, result.text()
    if result.isolation.startswith("bubblewrap") and _bwrap_has("--as-pid-1"):
        assert "it was skipped" not in result.text(), result.text()  # SIGKILL from inside: ignored by PID 1
    else:
        assert "code cell 2 (the one starting `# A helper left behind" in result.text()
        assert "it was skipped" in result.text()
    assert result.isolation.startswith("bubblewrap") and "uid 0;" not in result.isolation


def test_1_no_sandbox_means_no_grade(tmp_path):
    """Without bubblewrap nothing is graded from the command line, not even one submission:
    never as the grader's user."""
    marker = tmp_path / "ran.txt"
    nb = fixture(tmp_path, "attack_1_privileges", COURSE_FILE=marker, PTH_FILE=marker, RESULTS_FILE=marker)
    honest = tmp_path / "01_honest.ipynb"
    honest.write_bytes(SOLUTION_01.read_bytes())
    env = dict(os.environ, PATH="/nonexistent")  # no bwrap to be found
    proc = grade_cli(nb, honest, "--jobs", "2", cwd=ROOT, env=env)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "grading refused: bubblewrap is not installed" in proc.stderr
    assert proc.stdout.count("NOT GRADED") == 2 and "TOTAL" not in proc.stdout
    proc = grade_cli(nb, cwd=ROOT, env=env)
    assert proc.returncode == 3 and "NOT GRADED" in proc.stdout and "--no-isolation" in proc.stderr
    assert not marker.exists()


# ----------------------------------------------------------------------------- 2
def test_2_forbidden_calls_cannot_be_switched_off(tmp_path):
    """The library from a thread started earlier with the profiler saved and restored and
    getprofile faked; torch's attention with the profiler off: neither can be called."""
    result = grade_notebook(FIXTURES / "attack_2_forbidden_calls.ipynb", seed=2)
    checks = by_name(result)
    assert checks[MASK].score == 0 and "calls mhalib.np_attention.causal_mask" in checks[MASK].output
    assert checks[SDPA].score == 0
    assert "calls torch.nn.functional.scaled_dot_product_attention" in checks[SDPA].output


def test_2_the_child_has_no_course_package(tmp_path):
    """With the stand-ins taken away, ``import mhalib`` finds nothing: it is not there."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["mhalib"] = {"exercise": "01_single_head_attention"}
    nb.cells = [nbformat.v4.new_code_cell(
        "def causal_mask(n):\n"
        "    import sys\n"
        "    sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != '_Guard']\n"
        "    for name in [m for m in sys.modules if m.startswith('mhalib')]:\n"
        "        del sys.modules[name]\n"
        "    try:\n"
        "        import mhalib\n"
        "        found = mhalib.__file__\n"
        "    except ImportError:\n"
        "        found = None\n"
        "    raise RuntimeError(f'found={found} path={sys.path}')\n")]
    nbformat.write(nb, tmp_path / "probe.ipynb")
    output = by_name(grade_notebook(tmp_path / "probe.ipynb", limits=FAST, seed=3))[MASK].output
    assert "found=None" in output and str(ROOT) not in output, output


# ----------------------------------------------------------------------------- 3
def test_3_a_class_run_keeps_submissions_apart(tmp_path):
    """Graded beside honest classmates (--jobs 2): it finds no classmate to copy, kills
    nobody, and leaves no process and no file behind."""
    marker = f"attack3-{uuid.uuid4().hex}"
    klass = tmp_path / "class"
    attacker = fixture(tmp_path, "attack_3_classmates", klass / "01_mallory.ipynb", MARKER=marker)
    honest = [klass / f"01_student{i}.ipynb" for i in range(3)]
    for path in honest:
        path.write_bytes(SOLUTION_01.read_bytes())
    results = tmp_path / "results.json"
    proc = grade_cli(honest[0], attacker, *honest[1:], "--jobs", "2", "--results", results, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    data = {Path(s["submission"]).name: s for s in json.loads(results.read_text())["submissions"]}
    for path in honest:
        assert data[path.name]["score"] == 8, proc.stdout
    mallory = {t["name"]: t for t in data["01_mallory.ipynb"]["tests"]}
    assert mallory[MASK]["score"] == 0 and "no function named causal_mask" in mallory[MASK]["output"]
    time.sleep(0.5)
    assert processes_with(marker) == []
    for folder in ("/tmp", tmp_path, Path.home(), "/dev/shm", ROOT):
        assert not (Path(folder) / f"{marker}.bin").exists(), folder


# ----------------------------------------------------------------------------- 4
def test_4_a_stopped_child_cannot_block_the_class(tmp_path):
    """The child stops itself after a reply and the next cell is over 64 KiB: every read
    and write has a deadline, so the run ends, and the classmates are graded."""
    klass = tmp_path / "class"
    attacker = fixture(tmp_path, "attack_4_hang", klass / "01_stopper.ipynb")
    honest = klass / "01_honest.ipynb"
    honest.write_bytes(SOLUTION_01.read_bytes())
    start = time.monotonic()
    proc = grade_cli(attacker, honest, "--jobs", "2", "--timeout", "3", "--cell-timeout", "4",
                     "--results", tmp_path / "r.json", cwd=tmp_path, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert time.monotonic() - start < 120
    data = {Path(s["submission"]).name: s for s in json.loads((tmp_path / "r.json").read_text())["submissions"]}
    assert data["01_honest.ipynb"]["score"] == 8
    stopper = data["01_stopper.ipynb"]
    assert len(stopper["tests"]) == 3 and all(t["output"] for t in stopper["tests"])
    assert "did not finish within" in proc.stdout


def looping_submission(tmp_path):
    """Exercise 01 answered, then a top-level cell that names its process (a marker of
    this test alone, read back in /proc/N/comm) and loops; returns ``(notebook, marker)``."""
    marker = f"loop{uuid.uuid4().hex[:11]}"  # comm holds 15 characters
    nb = json.loads((FIXTURES / "fault_infinite_loop_in_cell.ipynb").read_text(encoding="utf-8"))
    nb["cells"][-1]["source"] = (f"import ctypes, time\nctypes.CDLL(None).prctl(15, {marker.encode()!r}, 0, 0, 0)\n"
                                 "while True:  # PR_SET_NAME above\n    time.sleep(0.05)\n")
    path = tmp_path / "01_looping.ipynb"
    path.write_text(json.dumps(nb), encoding="utf-8")
    return path, marker


def named(marker):
    """``{pid: parent pid}`` of the live processes (zombies left out) whose name is ``marker``."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() != marker:
                continue
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            found[int(pid)] = int(fields[1])
    return found


def gone(marker, within):
    """Wait up to ``within`` s for no process named ``marker``; kill what is left (the
    test leaves nothing behind) and return it, ``{pid: parent pid}``."""
    end = time.monotonic() + within
    while named(marker) and time.monotonic() < end:
        time.sleep(0.1)
    left = named(marker)
    for pid in left:
        try:
            os.kill(pid, 9)
        except OSError:
            pass
    return left


def bubblewrap_or_skip():
    """As the other attacks: without bubblewrap, skipped, except on CI, which must have it."""
    isolation = decide()
    if not os.environ.get("CI") and isolation.kind != "bubblewrap":
        pytest.skip(f"needs bubblewrap: {isolation.problem or isolation.kind}")
    assert isolation.kind == "bubblewrap", isolation.problem
    return isolation


GRADER_WITH = ("import sys\nfrom mhalib.grade.grader import grade_notebook\nfrom mhalib.grade.sandbox import "
               "Isolation, Limits\ngrade_notebook(sys.argv[1], isolation=Isolation('bubblewrap', userns=True, "
               "tmp_size=sys.argv[2] == 'True'), limits=Limits(cell_timeout_s=120, submission_s=300))\n")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_4_a_child_stopped_for_a_hang_is_gone(tmp_path):
    """A cell that loops past its limit: the child is killed itself (not only bubblewrap,
    which would leave it without a parent), before the grader goes on."""
    isolation = bubblewrap_or_skip()
    nb, marker = looping_submission(tmp_path)
    result = grade_notebook(nb, limits=Limits(cell_timeout_s=4, call_timeout_s=6), seed=4, isolation=isolation)
    assert "code cell 4 (the one starting `import ctypes, time`) did not finish within 4 s; it was skipped" \
        in result.text(), result.text()
    left = gone(marker, within=3)
    assert not left, f"the child outlived its hang: {left} (pid: parent pid)"


# ----------------------------------------------------------------------------- 5
def test_5_results_cannot_be_redirected_or_blocked(tmp_path):
    """results.json is a link to another file and class.csv a FIFO: the grader's files
    replace them; the linked file is untouched; the run does not hang."""
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("not the grader's\n")
    results, table = out / "results.json", out / "class.csv"
    results.symlink_to(victim)
    os.mkfifo(table)
    nb = fixture(tmp_path, "attack_5_results_file", RESULTS_FILE=results, CSV_FILE=table)
    proc = grade_cli(nb, "--results", results, "--csv", table, "--seed", "5", cwd=out, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert victim.read_text() == "not the grader's\n"
    assert results.is_file() and not results.is_symlink() and table.is_file()
    data = json.loads(results.read_text())
    # 2.5: causal_mask's 2.5 alone; its n < 1 check gives nothing (n = 0 returns an empty mask, and
    # the ValueError NumPy raises for n < 0 does not name the n given) nor does the unwritten attention
    assert data["score"] == 2.5 and len(data["tests"]) == 3
    rows = table.read_text().splitlines()
    assert rows[0].startswith("submission,exercise,score") and len(rows) == 2 and ",2.5," in rows[1]
    assert sorted(p.name for p in out.iterdir()) == ["class.csv", "results.json"]  # no temporary file left


# ----------------------------------------------------------------------------- 6
@pytest.fixture(scope="module")
def autograder_07(tmp_path_factory):
    """The zip `make autograder EXERCISE=07` builds, unpacked as Gradescope unpacks it."""
    folder = tmp_path_factory.mktemp("autograder")
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "build_autograder.py"), "--exercise", "07",
                           "--out", str(folder / "autograder.zip")], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    with zipfile.ZipFile(folder / "autograder.zip") as zf:
        zf.extractall(folder / "source")
    return folder / "source"


def gradescope(source, submission, results):
    return subprocess.run([sys.executable, "-m", "mhalib.grade.gradescope", "07", str(submission), str(results)],
                          cwd=source, capture_output=True, text=True, timeout=300)


def test_6_the_assignment_chooses_the_exercise(tmp_path, autograder_07):
    """An exercise-01 notebook uploaded to exercise 07's assignment is graded as 07."""
    submission = tmp_path / "submission"
    fixture(tmp_path, "attack_6_other_exercise", submission / "attack_6_other_exercise.ipynb")
    proc = gradescope(autograder_07, submission, tmp_path / "results.json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["extra_data"]["exercise"] == "07_mqa_gqa" and data["score"] == 0
    assert {t["name"] for t in data["tests"]} == {"grouped_query_attention", "multi_query_attention"}


def test_6_with_several_notebooks_the_one_meant_is_graded(tmp_path, autograder_07):
    submission = tmp_path / "submission"
    submission.mkdir()
    solution = ROOT / "solutions" / "07_mqa_gqa.ipynb"
    (submission / "07_mqa_gqa.ipynb").write_bytes(solution.read_bytes())
    (submission / "07_mqa_gqa-Copy1.ipynb").write_bytes((ROOT / "exercises" / "07_mqa_gqa.ipynb").read_bytes())
    (submission / ".ipynb_checkpoints").mkdir()
    (submission / ".ipynb_checkpoints" / "07_mqa_gqa-checkpoint.ipynb").write_text("{}")
    proc = gradescope(autograder_07, submission, tmp_path / "results.json")
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["score"] == 8, proc.stdout
    assert "2 notebooks were uploaded" in data["output"] and "kept the best: 07_mqa_gqa.ipynb" in data["output"]


# ----------------------------------------------------------------------------- 7
def test_7_honest_numbers_and_large_cells_get_full_marks(tmp_path):
    """kv_cache_bytes returning numpy.int64, and a cell of over 1 MiB."""
    table = ", ".join(str(2 ** (i % 40)) for i in range(150_000))
    nb = fixture(tmp_path, "attack_7_honest_numbers", BIG_TABLE=table)
    assert len(table) > 1 << 20
    result = grade_notebook(nb, limits=FAST, seed=7)
    assert result.score == result.max_score == 7, result.text()


@pytest.mark.parametrize("value, plain", [(np.int64(5), 5), (np.array(7), 7), (np.float32(0.5), 0.5),
                                          (np.array(2.5), 2.5), (np.bool_(True), True)])
def test_7_numpy_scalars_travel_as_numbers(value, plain):
    arrays = []
    decoded = worker.decode_value(worker.encode_value(value, arrays), arrays)
    assert decoded == plain and type(decoded) is type(plain) and arrays == []


# ----------------------------------------------------------------------------- 8
def test_8_a_sabotaged_pipe_is_a_result_not_an_error(tmp_path):
    """Closing the reply pipe, and a reply nested too deeply to parse: every check still
    has its result and its reason."""
    result = grade_notebook(FIXTURES / "attack_8_broken_replies.ipynb", limits=FAST, seed=8)
    assert [c.name for c in result.checks] == [MASK, "causal_mask (n < 1)", SDPA]
    assert result.score == 0 and "internal grader error" not in result.text()
    checks = by_name(result)
    assert "ended the process" in checks[MASK].output or "closed its connection" in checks[MASK].output
    assert "cannot read" in checks[SDPA].output


def test_8_deeply_nested_json_is_a_protocol_error():
    read, write = os.pipe()
    try:
        header = b"[" * 100_000 + b"]" * 100_000
        os.write(write, len(header).to_bytes(8, "big"))
        with pytest.raises(worker.ProtocolError):
            import threading

            threading.Thread(target=os.write, args=(write, header), daemon=True).start()
            worker.recv(read, time.monotonic() + 10)
        with pytest.raises(worker.Timeout):
            worker.recv(read, time.monotonic() + 0.2)  # nothing more comes: a deadline, not a hang
    finally:
        os.close(read)
        os.close(write)


# ----------------------------------------------------------------------------- 9
def test_9_student_text_is_bounded_and_never_a_report_line(tmp_path):
    """Megabytes printed, forged TOTAL lines in exception messages and in the file name."""
    nb = fixture(tmp_path, "attack_9_report_flood", tmp_path / "x\n  TOTAL 8 / 8\u2028.ipynb")
    proc = grade_cli(nb, "--results", tmp_path / "r.json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout) < 8000
    totals = [line for line in proc.stdout.splitlines() if line.lstrip().startswith("TOTAL")]
    # 0: every check fails, the n < 1 one too: the ValueError causal_mask raises does not name
    # the n it was given (0, then a negative n)
    assert totals == ["  TOTAL 0 / 8"], proc.stdout
    data = json.loads((tmp_path / "r.json").read_text())
    texts = [data["output"]] + [t["output"] for t in data["tests"]]
    assert sum(map(len, texts)) < 6000
    assert not any(re.match(r"\s*TOTAL", line) for text in texts for line in text.splitlines())


def needs_sandbox():
    isolation = decide()
    if not isolation.ok:
        pytest.skip(f"no sandbox here: {isolation.problem}")
    return isolation


# ----------------------------------------------------------------------------- 10
def test_10_forged_replies_are_wrong_answers_with_every_check_listed(tmp_path):
    """A reply with "printed": Infinity to a top-level cell, and one with numbers that
    overflow to a graded call: the cell is skipped, the call is a wrong answer, the other
    functions keep their points and every check is listed with its points."""
    needs_sandbox()
    result = grade_notebook(FIXTURES / "attack_10_forged_reply.ipynb", limits=FAST, seed=10)
    text = result.text()
    assert [c.name for c in result.checks] == [MASK, "causal_mask (n < 1)", SDPA], text
    assert result.max_score == 8 and "internal grader error" not in text
    checks = by_name(result)
    assert checks[MASK].score == checks[MASK].max_score, text
    assert checks[SDPA].score == 0 and "cannot read" in checks[SDPA].output, text
    assert "it was skipped" in text


@pytest.mark.parametrize("header", [b'{"printed": Infinity, "n_arrays": 0}', b'{"x": NaN, "n_arrays": 0}',
                                    b'{"printed": 1e999, "n_arrays": 0}', b'{"printed": -Infinity, "n_arrays": 0}'])
def test_10_non_finite_json_is_a_protocol_error(header):
    read, write = os.pipe()
    try:
        os.write(write, len(header).to_bytes(8, "big") + header)
        with pytest.raises(worker.ProtocolError):
            worker.recv(read, time.monotonic() + 5)
    finally:
        os.close(read)
        os.close(write)


# ----------------------------------------------------------------------------- 11
def test_11_a_wall_clock_caps_the_whole_submission(tmp_path):
    """Sleeping just under the cell and call limits in every cell and call: the whole
    submission ends at its own cap, and what did not run scores 0 with the reason."""
    needs_sandbox()
    limits = Limits(call_timeout_s=3, cell_timeout_s=4, submission_s=8)
    start = time.monotonic()
    result = grade_notebook(FIXTURES / "attack_11_slow_everywhere.ipynb", limits=limits, seed=11)
    elapsed = time.monotonic() - start
    assert elapsed < 8 + 6, (elapsed, result.text())  # the cap, and the start of the sandbox
    assert result.max_score == 8 and result.score < 8, result.text()
    assert "used up its 8 s of wall-clock time" in result.text()


def test_11_a_start_cut_short_by_the_submission_clock_names_that_clock():
    """Exercise 03 (its child imports torch) with a submission clock of 0.4 s: the start-up is
    cut short, and the report names the submission's clock, not the 60 s a start may take."""
    needs_sandbox()
    result = grade_notebook(ROOT / "solutions" / "03_mha_in_pytorch.ipynb", limits=Limits(submission_s=0.4), seed=11)
    text = result.text()
    assert "the submission used up its 0.4 s of wall-clock time" in text and "within 60 s" not in text, text
    assert result.score == 0 and len(result.checks) == 4, text


def test_11_submission_timeout_is_an_option_with_a_clear_error(tmp_path):
    proc = grade_cli(SOLUTION_01, "--submission-timeout", "0", cwd=tmp_path)
    assert proc.returncode == 2 and "--submission-timeout must be more than 0" in proc.stderr


# ----------------------------------------------------------------------------- 12
@pytest.mark.parametrize("userns", [False, True], ids=["as root or own uid", "user namespace"])
def test_12_the_sandbox_sees_nothing_of_the_graders_environment(tmp_path, monkeypatch, userns):
    """A variable planted in the grader's environment is in no file of the sandbox's /proc;
    no other process's memory can be opened; nothing outside /tmp can be written. With
    ``userns`` the sandbox is the one an ordinary user gets (uid 65534 in a user namespace)."""
    isolation = needs_sandbox()
    if isolation.kind != "bubblewrap":
        pytest.skip("needs bubblewrap")
    if userns and not isolation.userns and os.geteuid() != 0:
        pytest.skip("an ordinary user gets the user-namespace sandbox already")
    marker = f"PLANTED{uuid.uuid4().hex}"
    monkeypatch.setenv("MHALIB_TEST_SECRET", marker)
    nb = fixture(tmp_path, "attack_12_sandbox_environment", MARKER=marker)
    box = Isolation("bubblewrap", tmp_size=isolation.tmp_size, userns=userns or isolation.userns)
    result = grade_notebook(nb, limits=FAST, seed=12, isolation=box)
    output = by_name(result)[MASK].output
    assert "probe=[]" in output, result.text()
    assert marker not in result.text()


# ----------------------------------------------------------------------------- 14
@pytest.mark.parametrize("userns", [False, True], ids=["as root or own uid", "user namespace"])
def test_14_kernel_interfaces_are_refused_by_a_system_call_filter(tmp_path, userns):
    """Keyrings (which outlive a process and are shared by a uid: one submission could leave
    data for the next), ptrace, namespaces, eBPF, userfaultfd, perf events, io_uring and
    mounts, each called straight through syscall(): every one refused, while fork and
    threads still work. Without the filter the same probe lists add_key, keyctl, ptrace and
    unshare as working (run as root under bubblewrap)."""
    isolation = needs_sandbox()
    if not seccomp.supported():
        pytest.skip("no system-call filter for this machine")
    if isolation.kind != "bubblewrap" and userns:
        pytest.skip("needs bubblewrap")
    box = (Isolation("bubblewrap", tmp_size=isolation.tmp_size, userns=userns or isolation.userns)
           if isolation.kind == "bubblewrap" else isolation)
    result = grade_notebook(FIXTURES / "attack_14_kernel_interfaces.ipynb", limits=FAST, seed=14, isolation=box)
    output = by_name(result)[MASK].output
    assert "probe={'not refused': [], 'fork': 'ok', 'thread': 'ok'}" in output, result.text()
    assert "system calls filtered (seccomp)" in result.text()


# ----------------------------------------------------------------------------- 15
@pytest.mark.parametrize("userns", [False, True], ids=["as root or own uid", "user namespace"])
def test_15_memory_and_processes_are_capped_over_the_whole_submission(tmp_path, userns):
    """1.5 GiB in memfds (no address space counts them) and three forked processes of
    500 MiB each, under a 1 GiB limit: the memfds end in a kill named as the submission's
    memory limit, and at most two of the three processes live through it; 200 processes
    wanted, at most the limit's 64 started (the sandbox's own included)."""
    isolation = needs_sandbox()
    problem = cgroup.support()
    if problem:
        pytest.skip(f"no cgroup for the grader here: {problem}")
    if isolation.kind != "bubblewrap" and userns:
        pytest.skip("needs bubblewrap")
    box = (Isolation("bubblewrap", tmp_size=isolation.tmp_size, userns=userns or isolation.userns)
           if isolation.kind == "bubblewrap" else isolation)
    nb = fixture(tmp_path, "attack_15_memory_and_processes", MEMFD_MIB=1536, CHILD_MIB=500)
    limits = Limits(call_timeout_s=8, cell_timeout_s=15, memory_mb=1024)
    result = grade_notebook(nb, limits=limits, seed=15, isolation=box)
    checks, text = by_name(result), result.text()
    assert "used more than the submission's 1024 MiB of memory" in checks[MASK].output, text
    assert "memfds held" not in text, text
    held = [int(n) for n in re.findall(r"(\d) of 3 processes held 500 MiB", checks[SDPA].output)]
    assert held and max(held) <= 2, text
    started = [int(n) for n in re.findall(r"started (\d+) processes", checks[f"{MASK} (n < 1)"].output)]
    assert started and max(started) < 64 and min(started) > 10, text
    assert "1024 MiB and 64 processes for the whole submission (cgroup)" in text


def test_15_no_group_is_left_behind(tmp_path):
    """A submission's group is gone once it is graded, and its processes with it."""
    needs_sandbox()
    if cgroup.support():
        pytest.skip(f"no cgroup for the grader here: {cgroup.support()}")
    version, parents = cgroup._parents()
    mine = f"{cgroup.PREFIX}{os.getpid()}-"  # this process grades in-process: its groups' names

    def groups():
        return {n for _, parent in parents for n in os.listdir(parent) if n.startswith(mine)}

    before = groups()
    result = grade_notebook(SOLUTION_01, limits=FAST, seed=1)
    assert result.score == 8 and "(cgroup)" in result.text(), result.text()
    assert groups() <= before, groups() - before


def test_15_a_group_promised_but_not_made_means_no_grade(monkeypatch):
    """Where the grader has cgroups, a submission whose group cannot be made is not graded
    (fail closed), rather than graded without the limit its report promises."""
    needs_sandbox()
    if cgroup.support():
        pytest.skip(f"no cgroup for the grader here: {cgroup.support()}")

    def refuse(*args, **kwargs):
        raise cgroup.Unavailable("cgroup v1: No space left on device (planted)")

    monkeypatch.setattr(cgroup.Cgroup, "create", classmethod(refuse))
    result = grade_notebook(SOLUTION_01, limits=FAST, seed=1)
    assert result.score == 0, result.text()
    assert "control group could not be made (cgroup v1: No space left on device (planted))" in result.text()


def test_15_only_old_empty_groups_of_ended_graders_are_swept(tmp_path):
    dead = 4_000_000  # above the kernel's largest pid: no process has it
    young, stale, mine = (tmp_path / f"{cgroup.PREFIX}{pid}-x" for pid in (dead, dead + 1, os.getpid()))
    for folder in (young, stale, mine):
        folder.mkdir()
    os.utime(stale, (time.time() - 120, time.time() - 120))
    os.utime(mine, (time.time() - 120, time.time() - 120))
    cgroup._ACTIVE.add(mine.name)
    try:
        cgroup._sweep(str(tmp_path))
    finally:
        cgroup._ACTIVE.discard(mine.name)
    assert young.exists() and not stale.exists() and mine.exists()  # mine is in use
    cgroup._sweep(str(tmp_path), min_age_s=0)
    assert not young.exists() and not mine.exists()


# ----------------------------------------------------------------------------- 16
def names_cell(mib):
    """``mib`` MiB of code that is cheap to write and dear to compile: one name a line
    (Python builds an AST node and a code line for each: 1.2 GB and 3 s for 2 MiB, measured)."""
    return "a\n" * (mib << 19)


def with_cells(tmp_path, name, cells):
    """The attack-16 notebook with its last cell repeated, once per text in ``cells``."""
    nb = json.loads((FIXTURES / "attack_16_work_in_the_grader.ipynb").read_text(encoding="utf-8"))
    template = nb["cells"].pop()
    nb["cells"] += [dict(template, source=text) for text in cells]
    path = tmp_path / name
    path.write_text(json.dumps(nb), encoding="utf-8")
    return path


AUDITED_GRADER = """import json, sys
path, marker, mode = sys.argv[1:4]
data = open(path, "rb").read()
seen = []


def audit(event, args):  # every compile() of this process, as Python's audit events report it
    if event == "compile" and args and isinstance(args[0], (str, bytes)):
        text = args[0] if isinstance(args[0], str) else args[0].decode("utf-8", "replace")
        if marker in text:
            seen.append("compiled a cell")


sys.addaudithook(audit)
real_loads = json.loads


def loads(text, *args, **kwargs):
    if text in (data, data.decode("utf-8", "replace")):
        seen.append("parsed the notebook's JSON")
    return real_loads(text, *args, **kwargs)


json.loads = loads
from IPython.core import inputtransformer2

real_transform = inputtransformer2.TransformerManager.transform_cell


def transform(self, cell):
    if marker in cell:
        seen.append("converted a cell with IPython")
    return real_transform(self, cell)


inputtransformer2.TransformerManager.transform_cell = transform
from mhalib.grade.grader import grade_notebook
from mhalib.grade.sandbox import Isolation, decide

result = grade_notebook(path, seed=16, isolation=Isolation("none") if mode == "no isolation" else decide())
print(json.dumps({"seen": seen, "score": result.score, "text": result.text()}))
"""


@pytest.mark.parametrize("mode", ["sandbox", "no isolation"])
def test_16_nothing_of_a_submission_is_read_in_the_graders_process(tmp_path, mode):
    """The grader's process neither parses the notebook's JSON, nor converts its IPython syntax,
    nor compiles its cells (watched through Python's audit events and the two functions): the
    child does all three, under its limits and the submission's clock; the answers still get
    full marks, a ``%time`` line included. Before, the grader did all three itself, holding
    its interpreter lock: a notebook of large cells stopped classmates graded beside it."""
    if mode == "sandbox":
        needs_sandbox()
    marker = f"marker_{uuid.uuid4().hex}"
    nb = json.loads(SOLUTION_01.read_text(encoding="utf-8"))
    nb["cells"].append({"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
                        "source": f"# {marker}\n%time {marker} = 1\n"})
    path = tmp_path / "01_audited.ipynb"
    path.write_text(json.dumps(nb), encoding="utf-8")
    proc = subprocess.run([sys.executable, "-c", AUDITED_GRADER, path, marker, mode], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout.splitlines()[-1])
    assert report["seen"] == [], report
    assert report["score"] == 8, report["text"]


def class_run(tmp_path, paths, *options, wanted, within=300):
    """The command line grading ``paths`` with ``--jobs 2``, stopped (SIGTERM) as soon as its
    results file holds ``wanted``; returns ``{file name: result}`` of what it holds then."""
    results = tmp_path / "results.json"
    grader = subprocess.Popen([sys.executable, "-m", "mhalib.grade", *map(str, paths), "--jobs", "2",
                               "--results", str(results), "--quiet", *map(str, options)],
                              cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    found, end = {}, time.monotonic() + within
    try:
        while wanted not in found and grader.poll() is None and time.monotonic() < end:
            time.sleep(0.2)
            try:
                data = json.loads(results.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            found = {Path(r["submission"]).name: r for r in data.get("submissions", [])}
        if wanted not in found and results.exists():
            data = json.loads(results.read_text(encoding="utf-8"))
            found = {Path(r["submission"]).name: r for r in data.get("submissions", [])}
    finally:
        grader.terminate()
        out, err = grader.communicate(timeout=60)
    assert wanted in found, f"{wanted} was never graded: {out.decode()[-2000:]} {err.decode()[-2000:]}"
    return found


def test_16_big_cells_do_not_stop_a_classmate_graded_beside_them(tmp_path):
    """Six cells of 2 MiB of names (about 18 s of compiling) beside an honest classmate, --jobs 2:
    the compiling is the attacker's child's, on its own clock, and the classmate gets its
    8 points at once; each result is in the results file as soon as it is graded (the run is
    stopped then). Before, the grader compiled them itself, holding its interpreter lock, and
    the classmate's clock ran out waiting (2.67 / 8 at --submission-timeout 30)."""
    needs_sandbox()
    attacker = with_cells(tmp_path, "01_big_cells.ipynb", [names_cell(2)[:-2]] * 6)
    honest = tmp_path / "01_honest.ipynb"
    honest.write_bytes(SOLUTION_01.read_bytes())
    found = class_run(tmp_path, [attacker, honest], "--submission-timeout", "12", wanted=honest.name)
    assert found[honest.name]["score"] == 8, found[honest.name]


MEASURED_GRADER = """import json, resource, sys
from mhalib.grade import exercises
from mhalib.grade.grader import grade_notebook
from mhalib.grade.sandbox import Isolation, decide

isolation = Isolation("none") if sys.argv[2] == "no isolation" else decide()
exercises.all_exercises()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
result = grade_notebook(sys.argv[1], seed=16, isolation=isolation)
grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(json.dumps({"grew_mib": grew / 1024, "text": result.text()}))
"""


def test_16_a_cell_over_the_cap_is_not_run_and_the_grader_stays_small(tmp_path):
    """One cell of 4 MiB of names: over the 2 MiB a cell may hold, so the child does not run it
    (the report names the cell and the cap), and the grader's own memory grows by a few copies
    of the file, not by the 2.7 GB that compiling it takes (a 19 MiB cell took the grader to
    7.7 GB: two at --jobs 2 would have been killed for memory, losing the class's results)."""
    needs_sandbox()
    path = with_cells(tmp_path, "01_huge_cell.ipynb", [names_cell(4)])
    proc = subprocess.run([sys.executable, "-c", MEASURED_GRADER, path, "sandbox"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout.splitlines()[-1])
    assert "code cell 2 (the one starting `a`) was not run: it holds 4.0 MiB of code; cells over 2 MiB are not run" \
        in report["text"], report["text"]
    assert report["grew_mib"] < 16 * 4, report  # 16 times the file; compiling it in this process takes 670 times


def test_16_ipython_help_lines_are_converted_without_ipython(tmp_path):
    """A cell of 32 KB of ``a?`` lines (IPython's help), which IPython re-reads once per line it
    rewrites (153 s of the grader's time, outside any clock): more than 20 lines IPython would
    rewrite, so it is converted line by line, in the child (each line a ``pass``): no syntax
    error, and the run ends well within the 90 s this test waits (153 s before)."""
    needs_sandbox()
    path = fixture(tmp_path, "attack_16_work_in_the_grader", CELL="a?\n" * 10_922)  # 32,766 characters
    proc = grade_cli(path, cwd=tmp_path, timeout=90)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SYNTAX ERROR" not in proc.stdout and "no function named causal_mask" in proc.stdout, proc.stdout


STOPPED_IPYTHON = """import json, sys, time
from IPython.core import inputtransformer2
from mhalib.grade.grader import _approximate_python, to_python


def forever(self, cell):  # an IPython that never finishes a cell
    while True:
        pass


inputtransformer2.TransformerManager.transform_cell = forever
cell = "x = !ls\\ny = 1"
print(json.dumps(to_python(cell, deadline=time.monotonic() + 0.5) == _approximate_python(cell)))
"""


def test_16_ipythons_conversion_is_stopped_at_the_notebooks_budget():
    """The notebook's seconds of IPython are a hard cap: an interval timer stops IPython in the
    middle of a cell, which is then converted line by line (before, the budget was only
    looked at between cells, and one cell could take minutes)."""
    proc = subprocess.run([sys.executable, "-c", STOPPED_IPYTHON], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "true", proc.stdout + proc.stderr[-2000:]


def test_16_a_class_run_keeps_each_result_as_it_comes(tmp_path):
    """The CSV and the results file are written as each submission finishes: a grader killed
    (SIGKILL) while the next submission loops has kept the first one's row and result, and
    the looping submission's processes are gone. Before, both were written at the end only."""
    honest = tmp_path / "01_honest.ipynb"
    honest.write_bytes(SOLUTION_01.read_bytes())
    looping, marker = looping_submission(tmp_path)
    table, results = tmp_path / "grades.csv", tmp_path / "results.json"
    grader = subprocess.Popen([sys.executable, "-m", "mhalib.grade", honest, looping, "--no-isolation", "--csv", table,
                               "--results", results, "--cell-timeout", "120", "--submission-timeout", "300"],
                              cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        end = time.monotonic() + 120
        while not named(marker) and grader.poll() is None and time.monotonic() < end:
            time.sleep(0.1)
        assert named(marker), f"the looping cell never ran: {grader.poll()}"
    finally:
        grader.kill()
        stderr = grader.communicate()[1].decode(errors="replace")
    import csv

    rows = list(csv.DictReader(table.open(encoding="utf-8")))
    assert [(Path(r["submission"]).name, r["score"]) for r in rows] == [("01_honest.ipynb", "8")], stderr[-1000:]
    data = json.loads(results.read_text(encoding="utf-8"))
    assert [(Path(r["submission"]).name, r["score"]) for r in data["submissions"]] == [("01_honest.ipynb", 8.0)]
    assert not gone(marker, within=5)


# ----------------------------------------------------------------------------- 17
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("mode", ["sandbox", "user namespace", "no isolation"])
def test_17_no_process_outlives_a_killed_grader(tmp_path, mode):
    """A cell clears its parent-death signal, double-forks a grandchild into a session of its
    own, and both loop; three graders of it are killed, by SIGKILL, SIGTERM and SIGHUP: every
    process of the submission is gone within seconds, in the sandbox (as root: a uid of its
    own), in the user-namespace sandbox an ordinary user gets, and with --no-isolation. Each
    child is started by a keeper of the grader's, a child subreaper, which ends the whole
    tree when the grader's pipe to it closes, however the grader ended. Before, the looping
    child survived its grader in the user namespace (running as the instructor) and without
    isolation (with the instructor's rights). The keeper also removes the child's working
    folder, which a grader ended by a signal cannot."""
    isolation = bubblewrap_or_skip() if mode != "no isolation" else None
    if mode == "user namespace" and isolation.userns:
        pytest.skip("an ordinary user gets the user-namespace sandbox already")
    graders = {}
    scratch = tmp_path / "scratch"  # the graders' temporary folder: their children's working folders go here
    scratch.mkdir()
    for number in (signal.SIGKILL, signal.SIGTERM, signal.SIGHUP):
        marker = f"o{int(number)}{uuid.uuid4().hex[:12]}"  # comm holds 15 characters
        nb = fixture(tmp_path, "attack_17_outlive_the_grader", tmp_path / marker / "attack_17.ipynb", MARKER=marker)
        argv = ([sys.executable, "-c", GRADER_WITH, nb, str(isolation.tmp_size)] if mode == "user namespace" else
                [sys.executable, "-m", "mhalib.grade", nb, "--cell-timeout", "120", "--submission-timeout", "300",
                 *(["--no-isolation"] if mode == "no isolation" else [])])
        graders[number] = (subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                            env=dict(os.environ, TMPDIR=str(scratch))), marker)
    try:
        end = time.monotonic() + 120
        while (any(len(named(marker)) < 2 and grader.poll() is None for grader, marker in graders.values())
               and time.monotonic() < end):
            time.sleep(0.1)
        for number, (grader, marker) in graders.items():  # the child and its grandchild
            assert len(named(marker)) == 2, f"the attack did not run ({signal.Signals(number).name}): {grader.poll()}"
    finally:
        for number, (grader, _) in graders.items():
            grader.send_signal(number)
        stderr = {number: grader.communicate()[1].decode(errors="replace")[-300:]
                  for number, (grader, _) in graders.items()}
    left = {signal.Signals(number).name: gone(marker, within=5) for number, (_, marker) in graders.items()}
    assert not any(left.values()), f"outlived their grader (pid: parent pid): {left}; {stderr}"
    end = time.monotonic() + 10  # the keepers remove the working folders once the children are gone
    while list(scratch.glob("mhalib-grade-*")) and time.monotonic() < end:
        time.sleep(0.1)
    assert not list(scratch.glob("mhalib-grade-*")), "a killed grader's working folder stayed behind"


# ----------------------------------------------------------------------------- 18
def cpu_group_for_a_grader():
    """A fresh cpu cgroup (v1) under this process's own, for a grader to run in: the grader is
    then in one cpu group of its own, as in a container or a systemd unit, where the kernel's
    session autogroups do not share the processors. Skips where it cannot be set up."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to make a cpu cgroup for the grader to run in")
    if cgroup.support():
        pytest.skip(f"the grader has no cgroup here: {cgroup.support()}")
    if os.path.exists(os.path.join(cgroup.ROOT, "cgroup.controllers")):
        pytest.skip("cgroup v2: a grader inside a group of its own cannot give each submission a group there "
                    "(the group holds the grader, and v2 lets only a group without processes share out "
                    "its controllers); this test sets the grader up on cgroup v1")
    mount = os.path.join(cgroup.ROOT, "cpu")
    own = next((path for _, names, path in (line.rstrip("\n").split(":", 2)
                                            for line in open("/proc/self/cgroup", encoding="ascii"))
                if "cpu" in names.split(",")), None)
    if own is None or not os.path.exists(os.path.join(mount, "cgroup.procs")):
        pytest.skip("no cgroup v1 cpu controller mounted at /sys/fs/cgroup/cpu")
    folder = os.path.join(mount, own.lstrip("/"), f"mhalib-test-cpu-{uuid.uuid4().hex[:8]}")
    os.mkdir(folder)
    with open(os.path.join(folder, "cpu.shares"), "w", encoding="ascii") as f:
        f.write("16384")  # 16 times a process's weight: the machine's other work does not decide how it ends
    return folder


def remove_cpu_group(folder):
    """Remove the group and what the graders left in it (empty once their keepers are done)."""
    end = time.monotonic() + 10
    while os.path.isdir(folder) and time.monotonic() < end:
        for name in os.listdir(folder):
            if name.startswith(cgroup.PREFIX):
                try:
                    os.rmdir(os.path.join(folder, name))
                except OSError:
                    pass
        try:
            os.rmdir(folder)
        except OSError:
            time.sleep(0.1)


CLASS_WITH = """import json, os, sys, time
from concurrent.futures import ThreadPoolExecutor, as_completed
from mhalib.grade.grader import grade_notebook
from mhalib.grade.sandbox import Isolation, Limits, decide

mode, marker, attacker, honest = sys.argv[1:5]
isolation = decide() if mode == "sandbox" else Isolation("bubblewrap", userns=True, tmp_size=decide().tmp_size)
limits = Limits(submission_s=8)


def spinning():
    found = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            found += open(f"/proc/{pid}/comm").read().strip() == marker
        except OSError:
            pass
    return found


with ThreadPoolExecutor(2) as pool:  # as --jobs 2 does: two jobs, two slots
    futures = [pool.submit(grade_notebook, attacker, seed=18, isolation=isolation, limits=limits, slot=0)]
    end = time.monotonic() + 120
    while spinning() < 30 and time.monotonic() < end:  # the classmate is graded while the attack runs
        time.sleep(0.05)
    futures.append(pool.submit(grade_notebook, honest, seed=18, isolation=isolation, limits=limits, slot=1))
    for future in as_completed(futures):
        result = future.result()
        print(json.dumps({"path": result.path, "score": result.score, "text": result.text()}), flush=True)
"""


@pytest.mark.parametrize("mode", ["sandbox", "user namespace"])
def test_18_a_submission_cannot_take_the_processors_from_a_classmate(tmp_path, mode):
    """The grader runs inside one cpu cgroup; a submission starts 60 spinning processes, and an
    honest classmate is graded beside it once they spin (two jobs, --submission-timeout 8):
    each submission's group has an equal CPU weight, so the classmate gets its share and its
    8 points (the run is stopped then). Before, the scheduler shared the processors between
    processes, 61 of them: the classmate's child did not start before its clock ran out (0 / 8
    in 1 of 2 runs at the default 30 s)."""
    isolation = bubblewrap_or_skip()
    if mode == "user namespace" and isolation.userns:
        pytest.skip("an ordinary user gets the user-namespace sandbox already")
    folder = cpu_group_for_a_grader()
    marker = f"spin{uuid.uuid4().hex[:11]}"  # comm holds 15 characters
    attacker = fixture(tmp_path, "attack_18_cpu_starvation", tmp_path / "01_spinner.ipynb", SPINNERS=60, MARKER=marker)
    honest = tmp_path / "03_honest.ipynb"  # its child imports torch: 1.5 s of CPU alone
    honest.write_bytes((ROOT / "solutions" / "03_mha_in_pytorch.ipynb").read_bytes())
    grader = subprocess.Popen(["/bin/sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', folder, sys.executable,
                               "-c", CLASS_WITH, mode, marker, attacker, honest], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        graded = {}
        for line in grader.stdout:  # a line per submission as it is graded
            result = json.loads(line)
            graded[Path(result["path"]).name] = result
            if honest.name in graded:
                break
    finally:
        grader.kill()
        stderr = grader.communicate()[1]
        remove_cpu_group(folder)
    assert honest.name in graded, stderr[-2000:]
    assert not gone(marker, within=5)
    assert graded[honest.name]["score"] == 8, graded[honest.name]["text"]
    assert "an equal share of the CPU per submission (cgroup cpu weight)" in graded[honest.name]["text"]


# ----------------------------------------------------------------------------- 19
@pytest.mark.parametrize("userns", [False, True], ids=["as root or own uid", "user namespace"])
def test_19_every_socket_family_but_unix_is_refused(tmp_path, userns):
    """Every socket family but AF_UNIX, through socket() and socketpair(), with four socket
    types each, ends in EAFNOSUPPORT, refused by the system-call filter: AF_VSOCK (a virtual
    machine's host ports), AF_NETLINK, AF_PACKET, AF_ALG, AF_INET and the rest; AF_UNIX still
    works. Before, socket(AF_VSOCK) succeeded in the sandbox on cloud and Firecracker machines."""
    isolation = needs_sandbox()
    if not seccomp.supported():
        pytest.skip("no system-call filter for this machine")
    if isolation.kind != "bubblewrap" and userns:
        pytest.skip("needs bubblewrap")
    box = (Isolation("bubblewrap", tmp_size=isolation.tmp_size, userns=userns or isolation.userns)
           if isolation.kind == "bubblewrap" else isolation)
    result = grade_notebook(FIXTURES / "attack_19_socket_families.ipynb", limits=FAST, seed=19, isolation=box)
    assert "probe={'not refused': [], 'unix': 'ok'}" in by_name(result)[MASK].output, result.text()


def test_8_a_forked_process_never_answers_for_the_child(tmp_path):
    """Learner code that forks and lets both processes return: only the child the grader
    started answers (the fork ends at its reply), so no later call reads a stale reply."""
    needs_sandbox()
    nb = json.loads(SOLUTION_01.read_text(encoding="utf-8"))
    nb["cells"].append({"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
                        "source": "import os\n_mask = causal_mask\n\ndef causal_mask(n):\n    os.fork()\n"
                                  "    return _mask(n)\n"})
    path = tmp_path / "forks.ipynb"
    path.write_text(json.dumps(nb), encoding="utf-8")
    result = grade_notebook(path, limits=FAST, seed=8)
    assert result.score == result.max_score == 8, result.text()


# ----------------------------------------------------------------------------- 13
def test_13_a_syntax_error_is_reported_first_with_cell_and_line(tmp_path):
    needs_sandbox()
    result = grade_notebook(FIXTURES / "attack_13_syntax_error.ipynb", limits=FAST, seed=13)
    lines = result.text().splitlines()
    cell = "code cell 2 (the one starting `def causal_mask(n):`), line 6"  # the markdown cell not counted
    assert lines[1].startswith(f"  SYNTAX ERROR in {cell}: SyntaxError"), lines[:3]
    mask = by_name(result)[MASK].output
    assert mask.startswith(f"causal_mask was not defined: {cell} has a syntax error")
    assert "no function named" not in mask
    assert result.gradescope()["output"].splitlines()[1].startswith(f"SYNTAX ERROR in {cell}")


# ----------------------------------------------------------------------------- links and special files
@pytest.mark.parametrize("kind", ["link to the solution", "link to /proc/kmsg", "fifo", "proc file", "device",
                                  "folder"])
def test_only_regular_files_are_read(tmp_path, kind):
    path = tmp_path / "01_x.ipynb"
    if kind == "link to the solution":
        path.symlink_to(SOLUTION_01)
    elif kind == "link to /proc/kmsg":
        path.symlink_to("/proc/kmsg")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    else:
        path = Path("/proc/self/environ" if kind == "proc file" else "/dev/zero")
    start = time.monotonic()
    with pytest.raises(NotRegularFile) as error:
        read_submission(path)
    assert time.monotonic() - start < 2
    assert "only regular files are graded" in str(error.value)


def test_an_oversized_file_is_refused_by_its_size(tmp_path):
    path = tmp_path / "01_big.ipynb"
    path.write_bytes(b" " * 2048)
    with pytest.raises(NotebookError, match="refused"):
        read_submission(path, limit=1024)
    assert read_submission(path, limit=4096) == b" " * 2048


def test_a_class_run_refuses_links_and_special_files_by_name_and_goes_on(tmp_path):
    """A link to the solution, a link to /proc/kmsg (whose read blocks for ever), a FIFO
    and a /proc file, among honest classmates: each is named NOT GRADED with the reason in
    the report and the CSV; the honest ones are graded; the run ends."""
    needs_sandbox()
    klass = tmp_path / "class"
    klass.mkdir()
    honest = klass / "01_honest.ipynb"
    honest.write_bytes(SOLUTION_01.read_bytes())
    (klass / "01_copycat.ipynb").symlink_to(SOLUTION_01)
    (klass / "01_kmsg.ipynb").symlink_to("/proc/kmsg")
    os.mkfifo(klass / "01_fifo.ipynb")
    table = tmp_path / "grades.csv"
    proc = grade_cli(*sorted(klass.iterdir()), "/proc/self/environ", "--exercise", "01", "--jobs", "2",
                     "--csv", table, cwd=tmp_path, timeout=120)
    assert proc.returncode == 1, proc.stderr  # the run ends, and its status says that some were not graded
    assert proc.stdout.count("NOT GRADED") == 4, proc.stdout
    assert "symbolic link (to " in proc.stdout and "FIFO" in proc.stdout and "file of /proc" in proc.stdout
    assert "not graded, left out of the mean (4)" in proc.stdout
    import csv

    rows = {Path(r["submission"]).name: r for r in csv.DictReader(table.open())}
    assert rows["01_honest.ipynb"]["score"] != "" and float(rows["01_honest.ipynb"]["max_score"]) == 8
    for name, words in [("01_copycat.ipynb", "symbolic link"), ("01_kmsg.ipynb", "symbolic link"),
                        ("01_fifo.ipynb", "FIFO"), ("environ", "/proc")]:
        assert rows[name]["score"] == "" and rows[name]["checks"].startswith("not graded:"), rows[name]
        assert words in rows[name]["checks"]


# ----------------------------------------------------------------------------- CSV formulas
@pytest.mark.parametrize("start", ["=", "+", "-", "@", "\t", "\r"])
def test_csv_cells_never_start_a_formula(start):
    assert csv_cell(f"{start}HYPERLINK(1)") == f"'{start}HYPERLINK(1)"
    assert csv_cell("01_ada.ipynb") == "01_ada.ipynb" and csv_cell(8) == "8"


def test_a_file_named_as_a_formula_reaches_the_csv_as_text(tmp_path):
    needs_sandbox()
    nb = tmp_path / '=HYPERLINK("evil.example";"click").ipynb'
    nb.write_bytes(SOLUTION_01.read_bytes())
    proc = grade_cli(nb.name, "--csv", "grades.csv", "--exercise", "01", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    import csv

    rows = list(csv.reader((tmp_path / "grades.csv").open()))
    assert rows[1][0] == "'" + nb.name
    assert not any(cell.startswith(("=", "+", "-", "@", "\t", "\r")) for row in rows for cell in row)


# ----------------------------------------------------------------------------- without a sandbox
GRADED_ALIKE = ["fault_nan", "fault_wrong_dtype", "fault_missing_function", "cheat_library_call",
                "fault_exception", "attack_13_syntax_error"]


def test_no_isolation_grades_exactly_as_the_sandbox(tmp_path):
    """A learner without bubblewrap (--no-isolation): the solution gets what the sandbox
    gives it (full marks), and each wrong answer loses the same points."""
    isolation = needs_sandbox()
    none = Isolation("none")
    solution = grade_notebook(SOLUTION_01, limits=FAST, seed=21, isolation=none)
    assert solution.score == solution.max_score == 8, solution.text()
    for name in GRADED_ALIKE:
        path = FIXTURES / f"{name}.ipynb"
        boxed = grade_notebook(path, limits=FAST, seed=22, isolation=isolation)
        plain = grade_notebook(path, limits=FAST, seed=22, isolation=none)
        assert [(c.name, c.score) for c in plain.checks] == [(c.name, c.score) for c in boxed.checks], name
        assert plain.score < plain.max_score, name


def test_make_grade_runs_the_venv_grader_without_a_sandbox():
    proc = subprocess.run(["make", "-n", "grade", "NB=exercises/01_single_head_attention.ipynb"], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert 'nb="exercises/01_single_head_attention.ipynb"' in proc.stdout  # then read from where make started
    assert '.venv/bin/python -m mhalib.grade --no-isolation "$nb"' in proc.stdout
    proc = subprocess.run(["make", "grade", "NB=", "-o", ".venv/.installed"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2 and "name the notebook to grade" in proc.stderr


def test_every_protection_claim_names_a_test_that_exists():
    """docs/instructors.md: every row of the protection table names a test, and every test
    and fixture the guide names exists."""
    guide = (ROOT / "docs" / "instructors.md").read_text(encoding="utf-8")
    defined = {m for p in (ROOT / "tests").glob("test_*.py")
               for m in re.findall(r"^def (test_\w+)", p.read_text(encoding="utf-8"), re.M)}
    named = set(re.findall(r"::(test_\w+)`", guide))
    assert len(named) >= 15 and named <= defined, sorted(named - defined)
    section = guide[guide.index("## What the grader protects against"):guide.index("What each exercise forbids:")]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith(("| attempt", "| ---"))]
    assert len(rows) >= 15
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert "test_" in cells[-1] or re.search(r"`(fault|cheat)_\w+`", cells[-1]), row
    fixtures = set(re.findall(r"`((?:fault|cheat|attack)_\w+)`", section))
    assert fixtures and all((FIXTURES / f"{name}.ipynb").exists() for name in fixtures), fixtures
