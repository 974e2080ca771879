"""Faults and cheats: none crashes or hangs the grader; each scores zero on what it attacks.

Each case is a small notebook in tests/fixtures/grader/. The attacked function must
score 0 with a message that says why; the function the fixture leaves correct must
keep its full marks (the attack does not spill over).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mhalib.grade.grader import grade_notebook
from mhalib.grade.sandbox import Limits

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "grader"
MASK, SDPA = "causal_mask", "scaled_dot_product_attention"
FAST = Limits(call_timeout_s=6, cell_timeout_s=15, memory_mb=768)
# What the fixtures' plain causal_mask earns: the mask itself (2.5 of 2.5) and none of the check that
# n < 1 raises a ValueError saying what was given (0.5): NumPy refuses a negative n by itself, without naming it.
MASK_ONLY = 2.5

# fixture -> {graded name: (score "zero" | "full", words the feedback must contain)}
CASES = {
    "cheat_patch_allclose": {MASK: ("full", ""), SDPA: ("zero", "rows do not sum to 1")},
    "cheat_eq_always_true": {MASK: ("full", ""), SDPA: ("zero", "got an object of type Liar")},
    "cheat_eq_subclass": {MASK: ("zero", "wrong"), SDPA: ("full", "")},
    "cheat_library_call": {MASK: ("zero", "calls mhalib.np_attention.causal_mask"),
                           SDPA: ("zero", "calls mhalib.scaled_dot_product_attention")},
    "cheat_torch_sdpa": {MASK: ("full", ""),
                         SDPA: ("zero", "calls torch.nn.functional.scaled_dot_product_attention")},
    "cheat_disable_tracing": {MASK: ("full", ""),
                              SDPA: ("zero", "calls mhalib.np_attention.scaled_dot_product_attention")},
    "cheat_mutates_input": {"split_heads": ("zero", "changed its input x in place"), "merge_heads": ("full", "")},
    "cheat_mutates_and_patches": {"split_heads": ("zero", "changed its input x in place"),
                                  "merge_heads": ("full", "")},
    "fault_os_exit_in_function": {MASK: ("full", ""), SDPA: ("zero", "ended the process")},
    "fault_os_exit_in_cell": {MASK: ("full", ""), SDPA: ("full", "")},
    "fault_sys_exit": {MASK: ("full", ""), SDPA: ("zero", "SystemExit")},
    "fault_infinite_loop": {MASK: ("full", ""), SDPA: ("zero", "did not finish within 6 s")},
    "fault_infinite_loop_in_cell": {MASK: ("full", ""), SDPA: ("full", "")},
    "fault_runaway_memory": {MASK: ("full", ""), SDPA: ("zero", "MemoryError")},
    "fault_print_megabytes": {MASK: ("zero", "must be 0.0"), SDPA: ("full", "")},
    "fault_fake_results": {MASK: ("full", ""), SDPA: ("zero", "not written yet")},
    "fault_missing_function": {MASK: ("full", ""), SDPA: ("zero", "no function named scaled_dot_product_attention")},
    "fault_wrong_signature": {MASK: ("full", ""), SDPA: ("zero", "wrong signature")},
    "fault_exception": {MASK: ("full", ""), SDPA: ("zero", "raised ValueError: shapes do not line up")},
    "fault_nan": {MASK: ("full", ""), SDPA: ("zero", "contains NaN")},
    "fault_wrong_dtype": {MASK: ("zero", "booleans"), SDPA: ("zero", "float16")},
    "ok_written_differently": {MASK: ("full", ""), SDPA: ("full", "")},
    "ok_warnings_to_stderr": {MASK: ("full", ""), SDPA: ("full", "")},
    "01_truncated": {MASK: ("zero", "not a readable notebook"), SDPA: ("zero", "not a readable notebook")},
    "01_not_a_notebook": {MASK: ("zero", "not a readable notebook"), SDPA: ("zero", "not a readable notebook")},
    "01_json_not_a_notebook": {MASK: ("zero", "not a readable notebook"),
                               SDPA: ("zero", "not a readable notebook")},
}
TORCH_CASES = {
    "cheat_torch_mha_builtin": {"MultiHeadAttention": ("zero", "calls torch.nn.MultiheadAttention"),
                                "MultiHeadAttention (causal=True)": ("zero", "torch.nn.MultiheadAttention"),
                                "to_torch_mha": ("full", "")},
}


def test_every_fixture_has_an_expectation():
    names = {p.stem for p in FIXTURES.glob("*.ipynb") if not p.stem.startswith("attack_")}  # test_grader_attacks
    assert names == set(CASES) | set(TORCH_CASES)


def _check(result, expected):
    by_name = {c.name: c for c in result.checks}
    for name, (kind, words) in expected.items():
        check = by_name[name]
        if kind == "full":
            assert check.score == check.max_score, f"{name}: {check.output}"
        else:
            assert check.score == 0, f"{name}: {check.output}"
            assert words in check.output, f"{name}: {check.output!r} lacks {words!r}"
            assert check.status == "failed"


@pytest.mark.parametrize("name", sorted(CASES))
def test_fault_or_cheat(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # fault_fake_results writes into the grader's working directory
    result = grade_notebook(FIXTURES / f"{name}.ipynb", limits=FAST, seed=7)
    assert result.exercise is not None, result.text()
    _check(result, CASES[name])
    text = result.text()
    assert len(text) < 10_000, "the grader's own output must stay short"
    if name == "fault_print_megabytes":
        assert "TOTAL 8 / 8" not in text and "discarded" in text
    if name in ("fault_os_exit_in_cell", "fault_infinite_loop_in_cell"):
        assert "it was skipped" in text
    if name == "cheat_eq_always_true":
        assert result.score == MASK_ONLY


@pytest.mark.parametrize("name", sorted(TORCH_CASES))
def test_torch_cheat(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = grade_notebook(FIXTURES / f"{name}.ipynb", limits=Limits(call_timeout_s=30, cell_timeout_s=60), seed=7)
    _check(result, TORCH_CASES[name])


def test_fake_results_file_is_overwritten_by_the_grader(tmp_path):
    """The submission writes results.json / class.csv where it can; the grader's own win."""
    (tmp_path / "class.csv").write_text("submission,exercise,score\nold,01,1\n")
    proc = subprocess.run(
        [sys.executable, "-m", "mhalib.grade", str(FIXTURES / "fault_fake_results.ipynb"),
         "--results", "results.json", "--csv", "class.csv", "--seed", "3"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["score"] == MASK_ONLY and len(data["tests"]) == 3
    rows = (tmp_path / "class.csv").read_text().splitlines()
    assert rows[0].startswith("submission,exercise,score,") and rows[1].startswith("old,01,1,") and len(rows) == 3
    assert "100" not in rows[2].split(",")[2]


def test_patching_comparisons_in_the_submission_cannot_reach_the_grader(tmp_path, monkeypatch):
    """The grader compares in its own process: its numpy stays untouched."""
    import numpy as np

    monkeypatch.chdir(tmp_path)
    before = np.allclose
    result = grade_notebook(FIXTURES / "cheat_patch_allclose.ipynb", limits=FAST, seed=1)
    assert np.allclose is before and not np.allclose(0.0, 1.0)
    assert result.score == MASK_ONLY


def test_submission_runs_in_another_process_and_directory(tmp_path):
    """Code in the notebook runs in its own process, in a private /tmp, without torch for a
    NumPy exercise, and cannot write where the grader runs."""
    import os

    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["mhalib"] = {"exercise": "01_single_head_attention"}
    probe = tmp_path / "probe.txt"
    nb.cells = [nbformat.v4.new_code_cell(
        "import os, sys\n"
        "import numpy as np\n"
        "torch_loaded = any(m == 'torch' or m.startswith('torch.') for m in sys.modules)\n"
        "try:\n"
        f"    open({str(probe)!r}, 'w').write('written')\n"
        "    wrote = True\n"
        "except OSError:\n"
        "    wrote = False\n"
        "def causal_mask(n):\n"
        "    raise RuntimeError(f'pid={os.getpid()} torch={torch_loaded} cwd={os.getcwd()} wrote={wrote}')\n")]
    path = tmp_path / "probe.ipynb"
    nbformat.write(nb, path)
    output = grade_notebook(path, limits=FAST).checks[0].output
    assert f"pid={os.getpid()} " not in output and "torch=False cwd=/tmp wrote=False" in output, output
    assert not probe.exists()
