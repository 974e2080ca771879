"""Fixed draws and per-student variants.

* Draws: with the instructor's secret, a student's inputs are drawn from
  ``HMAC(secret, student ID + exercise)``: a resubmission and every notebook of one upload are
  graded on the same inputs, and the report says so; without one the draws stay fresh and the
  report says they are not fixed. Several notebooks of one Gradescope upload are one draw.
* Variants (exercises 06, 07, 09): the course's own exercise without an ID; with one, another
  layout or convention, drawn from the ID alone. Answers written here for each variant,
  independently of the grader's references (loops over heads and pairs, axes named by einsum),
  get full marks; the course's own answer (the solution notebook, which computes what mhalib's
  functions compute) loses points with feedback that names the variant.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest

from mhalib.check import check, variant
from mhalib.grade import exercises as registry
from mhalib.grade import gradescope
from mhalib.grade.grader import grade_notebook
from mhalib.grade.sandbox import Limits
from mhalib.grade.spec import Draws, student_seed, variant_of
from notebook_files import one_cell_notebook

ROOT = Path(__file__).resolve().parents[1]
LIMITS = Limits(call_timeout_s=60, cell_timeout_s=120)
SECRET = b"a course secret of more than sixteen bytes"


def _ids_by_variant(ex, wanted=None):
    """``{code: a student ID whose variant it is}`` for every variant of ``ex`` an ID draws."""
    found = {}
    for i in range(500):
        sid = f"s{1000 + i}"
        found.setdefault(variant_of(ex, sid).code, sid)
    return found


# ----------------------------------------------------------------------------- draws
def test_student_seed_is_an_hmac_of_the_secret_the_id_and_the_exercise():
    mac = hmac.new(SECRET, b"s1001\n07_mqa_gqa", hashlib.sha256).digest()
    assert student_seed(SECRET, "s1001", "07_mqa_gqa") == int.from_bytes(mac[:8], "big") >> 1
    assert student_seed(SECRET, " S1001 ", "07_mqa_gqa") == student_seed(SECRET, "s1001", "07_mqa_gqa")
    seeds = {student_seed(SECRET, sid, key) for sid in ("s1001", "s1002") for key in ("06_kv_cache", "07_mqa_gqa")}
    seeds.add(student_seed(SECRET + b"!", "s1001", "07_mqa_gqa"))
    assert len(seeds) == 5  # another student, exercise or secret: other inputs


def test_fixed_draws_grade_a_resubmission_on_the_same_inputs_and_say_so(tmp_path):
    """With the secret: the same inputs at every run (the same seed, the same failing cases);
    another student gets others. Without it: fresh inputs, and the report says they are not fixed."""
    key = "07_mqa_gqa"
    path = one_cell_notebook(tmp_path / f"{key}.ipynb", key,
                     "import numpy as np\n\n"
                     "def grouped_query_attention(x, w_q, w_k, w_v, w_o, num_heads, num_kv_heads, mask=None):\n"
                     "    raise ValueError(f'{x.shape}')\n"
                     "\ndef multi_query_attention(x, w_q, w_k, w_v, w_o, num_heads, mask=None):\n"
                     "    raise ValueError(f'{x.shape}')\n")
    ada = Draws("s1001", "roster", SECRET)
    first, again = (grade_notebook(path, student=ada, limits=LIMITS) for _ in range(2))
    other = grade_notebook(path, student=Draws("s1002", "roster", SECRET), limits=LIMITS)
    assert first.seed == again.seed == student_seed(SECRET, "s1001", key) != other.seed
    assert [c.output for c in first.checks] == [c.output for c in again.checks]  # the shapes it raised
    assert "inputs: fixed for student s1001 (roster)" in first.text()
    fresh = [grade_notebook(path, limits=LIMITS) for _ in range(2)]
    assert fresh[0].seed != fresh[1].seed
    assert "inputs: drawn fresh for this run, not fixed" in fresh[0].text()
    nameless = grade_notebook(path, student=Draws("", "", SECRET), limits=LIMITS)
    assert "not fixed: the submission has no student ID" in nameless.text()


def test_several_notebooks_of_one_upload_are_one_draw(tmp_path, monkeypatch):
    """Six copies of a partly right notebook, best kept, were six draws: full marks came 51% of
    the time where one copy had 11%. Every notebook of one upload is now graded on the same inputs."""
    from mhalib.grade.sandbox import decide

    seeds = []
    real = gradescope.grade_notebook

    def spy(path, **kwargs):
        seeds.append(kwargs.get("seed"))
        return real(path, **kwargs)

    monkeypatch.setattr(gradescope, "grade_notebook", spy)
    submission = tmp_path / "submission"
    submission.mkdir()
    for name in ("06_kv_cache.ipynb", "06_kv_cache-Copy1.ipynb", "06_kv_cache (1).ipynb"):
        shutil.copy(ROOT / "exercises" / "06_kv_cache.ipynb", submission / name)
    notebooks = gradescope.candidates(submission)
    best = gradescope.grade_upload(submission, notebooks, registry.get("06"), decide(unisolated=True))
    assert len(seeds) == 3 and len(set(seeds)) == 1 and seeds[0] is not None, seeds
    assert "all on the same inputs" in best.notes[0]


def test_gradescope_reads_the_student_id_from_the_submission_metadata(tmp_path):
    meta = tmp_path / "submission_metadata.json"
    users = [{"email": "ada@example.com", "id": 1234, "name": "Ada Lovelace"}]
    meta.write_text(json.dumps({"id": 1, "users": users}))
    assert gradescope.student_from_metadata(meta) == "1234"  # Gradescope's user ID, as documented
    users[0]["sid"] = "s1001"
    meta.write_text(json.dumps({"id": 1, "users": users + [{"id": 99, "sid": "s0999"}]}))
    assert gradescope.student_from_metadata(meta) == "s0999"  # a group: the smallest ID
    for broken in ("", "{", "[]", json.dumps({"users": "ada"}), json.dumps({"users": [{"id": True}]})):
        meta.write_text(broken)
        assert gradescope.student_from_metadata(meta) == ""
    assert gradescope.student_from_metadata(tmp_path / "missing.json") == ""


def test_gradescope_with_a_secret_fixes_each_students_inputs(tmp_path):
    """The secret in the zip (``--add-to``) and the metadata's ID: two runs on one upload give the
    same inputs and feedback; the results do not show the seed."""
    from mhalib.grade.sandbox import decide

    if not decide(container=True).ok:
        pytest.skip("no isolation here")
    secret = tmp_path / "grading_secret"
    secret.write_bytes(SECRET)
    built = tmp_path / "autograder.zip"
    with zipfile.ZipFile(built, "w") as zf:
        zf.writestr("run_autograder", "#!/bin/sh\n")
    assert gradescope.main(["--add-to", str(built), "--secret", str(secret), "--variants"]) == 0
    with zipfile.ZipFile(built) as zf:
        assert zf.read("grading_secret").strip() == SECRET
        assert json.loads(zf.read("grading.json")) == {"variants": True}
    assert gradescope.main(["--add-to", str(built), "--secret", str(secret)]) == 2  # never twice
    short = tmp_path / "short"
    short.write_bytes(b"guessable")
    assert gradescope.main(["07", "--secret", str(short)]) == 2

    submission = tmp_path / "submission"
    submission.mkdir()
    shutil.copy(ROOT / "solutions" / "07_mqa_gqa.ipynb", submission / "07_mqa_gqa.ipynb")
    meta = tmp_path / "submission_metadata.json"
    meta.write_text(json.dumps({"users": [{"email": "ada@example.com", "id": 1234, "name": "Ada", "sid": "s1001"}]}))
    outputs = []
    for run in range(2):
        results = tmp_path / f"results{run}.json"
        assert gradescope.main(["07", str(submission), str(results), "--secret", str(secret),
                                "--metadata", str(meta)]) == 0
        data = json.loads(results.read_text())
        assert "seed" not in data["extra_data"] and data["score"] == 8, data
        assert "Inputs: fixed for student s1001 (gradescope)" in data["output"]
        outputs.append([t["output"] for t in data["tests"]])
    assert outputs[0] == outputs[1]


# ----------------------------------------------------------------------------- variants: which
VARIANT_EXERCISES = ("06_kv_cache", "07_mqa_gqa", "09_beyond_gqa")


@pytest.mark.parametrize("key", VARIANT_EXERCISES)
def test_no_id_is_the_course_exercise_and_every_id_draws_another_variant(key):
    ex = registry.get(key)
    assert len(ex.variants) >= 3 and ex.variants[0].code == ""
    assert variant_of(ex, "") is variant_of(ex, None) is ex.variants[0]
    drawn = [variant_of(ex, f"s{1000 + i}").code for i in range(300)]
    assert "" not in drawn  # mhalib's version is nobody's variant
    assert set(drawn) == {v.code for v in ex.variants[1:]}  # each variant is somebody's
    assert variant_of(ex, "s1001") is variant_of(ex, " S1001 ")
    assert all(variant_of(registry.get(k), "s1001") is None for k in registry.all_exercises() if k not in
               VARIANT_EXERCISES)


@pytest.mark.parametrize("key", VARIANT_EXERCISES)
def test_the_default_draws_are_the_course_exercise_unchanged(key):
    """No ID: the cases and answers are those the exercise had before it had variants."""
    ex = registry.get(key)
    for graded in ex.graded:
        plain = graded.make_cases(np.random.default_rng(7))
        for cases in (graded.cases(np.random.default_rng(7)), graded.cases(np.random.default_rng(7), ex.variants[0])):
            assert [c.label for c in cases] == [c.label for c in plain]
            for a, b in zip(cases, plain):
                assert all(np.array_equal(x, y) for x, y in zip(a.args, b.args) if isinstance(x, np.ndarray))
                if a.expected is not None:
                    expected = a.expected if isinstance(a.expected, tuple) else (a.expected,)
                    for x, y in zip(expected, b.expected if isinstance(b.expected, tuple) else (b.expected,)):
                        np.testing.assert_array_equal(x, y)


def test_variant_prints_what_to_write_and_sets_what_check_tests(capsys):
    ex = registry.get("07")
    sid = _ids_by_variant(ex)["B"]
    chosen = variant("07", sid)
    out = capsys.readouterr().out
    assert chosen.code == "B" and f"student '{sid}': variant B" in out and "h % g" in out
    assert variant("01", sid) is None and "no variants" in capsys.readouterr().out
    assert variant("99") is None and "there is no exercise" in capsys.readouterr().out
    try:
        assert check("grouped_query_attention", ANSWERS["07"]["B"]) is True
        assert "visible tests of variant B pass" in capsys.readouterr().out
        variant("07", "")  # back to the course's own exercise
        assert check("grouped_query_attention", ANSWERS["07"]["B"]) is False
        assert "not np.tile" in capsys.readouterr().out  # the course's own exercise, as it always was
    finally:
        variant("07", "")


# ----------------------------------------------------------------------------- variants: answers
def _decode_06(layout):
    """decode_step for caches of ``layout`` ("bthd": (B, T, H, d_head)), heads one at a time."""
    def decode_step(x_new, k_cache, v_cache, w_q, w_k, w_v, w_o, num_heads):
        kc = np.einsum(f"{layout}->bhtd", k_cache)
        vc = np.einsum(f"{layout}->bhtd", v_cache)
        b, _, d_model = x_new.shape
        dh = d_model // num_heads
        new_k = (x_new @ w_k).reshape(b, num_heads, dh)[:, :, None]  # (B, H, 1, d_head)
        new_v = (x_new @ w_v).reshape(b, num_heads, dh)[:, :, None]
        kc, vc = np.concatenate([kc, new_k], axis=2), np.concatenate([vc, new_v], axis=2)
        q = (x_new @ w_q).reshape(b, num_heads, dh)
        out = np.zeros((b, d_model))
        for h in range(num_heads):
            s = np.einsum("bd,btd->bt", q[:, h], kc[:, h]) / np.sqrt(dh)
            p = np.exp(s - s.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            out[:, h * dh:(h + 1) * dh] = np.einsum("bt,btd->bd", p, vc[:, h])
        back = f"bhtd->{layout}"
        return (out @ w_o)[:, None], np.einsum(back, kc), np.einsum(back, vc)
    return decode_step


def _gqa_07(round_robin, interleaved):
    """grouped_query_attention of a variant, one query head at a time."""
    def grouped_query_attention(x, w_q, w_k, w_v, w_o, num_heads, num_kv_heads, mask=None):
        if num_heads % num_kv_heads:
            raise ValueError(f"{num_kv_heads} K/V heads cannot serve {num_heads} query heads evenly")
        d_model = x.shape[-1]
        dh = d_model // num_heads

        def columns(head, heads):
            return np.arange(head, heads * dh, heads) if interleaved else np.arange(head * dh, (head + 1) * dh)
        q_all, k_all, v_all = x @ w_q, x @ w_k, x @ w_v
        merged, maps = np.zeros(x.shape[:-1] + (d_model,)), []
        for h in range(num_heads):
            j = h % num_kv_heads if round_robin else h // (num_heads // num_kv_heads)
            q, k, v = q_all[..., columns(h, num_heads)], k_all[..., columns(j, num_kv_heads)], v_all[..., columns(j, num_kv_heads)]
            s = q @ np.swapaxes(k, -1, -2) / np.sqrt(dh) + (0 if mask is None else mask)
            p = np.exp(s - s.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            merged[..., columns(h, num_heads)] = p @ v
            maps.append(p)
        return merged @ w_o, np.stack(maps, axis=-3)
    return grouped_query_attention


def _mqa_07(gqa):
    def multi_query_attention(x, w_q, w_k, w_v, w_o, num_heads, mask=None):
        return gqa(x, w_q, w_k, w_v, w_o, num_heads, 1, mask)
    return multi_query_attention


def _rope_09(neighbours):
    """apply_rope, one pair at a time: (x[2i], x[2i+1]) or (x[i], x[i + d/2])."""
    def apply_rope(x, positions, base=10000.0):
        x = np.asarray(x, dtype=float)
        d = x.shape[-1]
        if d % 2:
            raise ValueError(f"head_dim={d} is odd")
        out = x.copy()
        for i in range(d // 2):
            a, b = (2 * i, 2 * i + 1) if neighbours else (i, i + d // 2)
            angle = np.asarray(positions, dtype=float)[:, None] * base ** (-2 * i / d)  # (N, 1)
            out[..., a:a + 1] = x[..., a:a + 1] * np.cos(angle) - x[..., b:b + 1] * np.sin(angle)
            out[..., b:b + 1] = x[..., b:b + 1] * np.cos(angle) + x[..., a:a + 1] * np.sin(angle)
        return out
    return apply_rope


def _decode_09(rope, layout):
    """gqa_rope_decode_step for caches of ``layout`` ("bgtd" or "btgd"), with ``rope``."""
    def gqa_rope_decode_step(x_new, k_cache, v_cache, w_q, w_k, w_v, w_o, num_heads, num_kv_heads):
        if num_heads % num_kv_heads:
            raise ValueError(f"{num_kv_heads} K/V heads cannot serve {num_heads} query heads evenly")
        kc, vc = np.einsum(f"{layout}->bgtd", k_cache), np.einsum(f"{layout}->bgtd", v_cache)
        b, _, d_model = x_new.shape
        dh, t = d_model // num_heads, kc.shape[2]
        q = rope((x_new @ w_q).reshape(b, num_heads, 1, dh), [t])
        k = rope((x_new @ w_k).reshape(b, num_kv_heads, 1, dh), [t])
        v = (x_new @ w_v).reshape(b, num_kv_heads, 1, dh)
        kc, vc = np.concatenate([kc, k], axis=2), np.concatenate([vc, v], axis=2)
        out = np.zeros((b, d_model))
        for h in range(num_heads):
            j = h // (num_heads // num_kv_heads)
            s = np.einsum("bd,btd->bt", q[:, h, 0], kc[:, j]) / np.sqrt(dh)
            p = np.exp(s - s.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            out[:, h * dh:(h + 1) * dh] = np.einsum("bt,btd->bd", p, vc[:, j])
        return (out @ w_o)[:, None], np.einsum(f"bgtd->{layout}", kc), np.einsum(f"bgtd->{layout}", vc)
    return gqa_rope_decode_step


def _answers():
    """``{exercise: {variant code: {name: function}}}``, written here for each variant."""
    gqa = {code: _gqa_07(rr, il) for code, rr, il in (("", False, False), ("B", True, False), ("C", False, True),
                                                       ("D", True, True))}
    return {
        "06": {code: {"decode_step": _decode_06(layout)} for code, layout in (("", "bhtd"), ("B", "bthd"),
                                                                                ("C", "tbhd"))},
        "07": {code: {"grouped_query_attention": fn, "multi_query_attention": _mqa_07(fn)} for code, fn in gqa.items()},
        "09": {code: {"apply_rope": _rope_09(nb), "gqa_rope_decode_step": _decode_09(_rope_09(nb), layout)}
               for code, nb, layout in (("", False, "bgtd"), ("B", True, "bgtd"), ("C", True, "btgd"))},
    }


ANSWERS = {number: {code: fns.get("grouped_query_attention") for code, fns in by_code.items()}
           for number, by_code in _answers().items()}
CASES = [(number, code) for number, by_code in _answers().items() for code in by_code]


@pytest.mark.parametrize("number, code", CASES, ids=[f"{n}-{c or 'own'}" for n, c in CASES])
def test_each_variant_has_right_answers_and_the_others_are_named_wrong(number, code, capsys):
    """check() with the variant set: the variant's own answer passes every check it changes; each
    other variant's answer fails, and the feedback names what it is."""
    ex = registry.get(number)
    answers = _answers()[number]
    sid = _ids_by_variant(ex).get(code, "")
    try:
        assert variant(number, sid).code == code
        capsys.readouterr()
        for name, fn in answers[code].items():
            assert check(name, fn) is True, capsys.readouterr().out
        for other, fns in answers.items():
            if other == code:
                continue
            results = {name: check(name, fn) for name, fn in fns.items()}
            out = capsys.readouterr().out
            assert not all(results.values()), (code, other)
            if code and other == "":  # the course's own answer (mhalib's, pasted) is named as such
                assert "course's own" in out, out
    finally:
        variant(number, "")


@pytest.mark.parametrize("number", ["06", "07", "09"])
def test_the_grader_grades_the_students_variant(number, tmp_path):
    """In the sandbox, with --variants: a variant's answer gets full marks; the course's own
    answer (the solution notebook, computing what mhalib's functions compute) loses points,
    and the feedback names the variant."""
    import inspect

    ex = registry.get(number)
    code = ex.variants[-1].code
    sid = _ids_by_variant(ex)[code]
    helpers = {"06": [_decode_06], "07": [_gqa_07, _mqa_07], "09": [_rope_09, _decode_09]}[number]
    build = {"06": "decode_step = _decode_06({layout!r})\n",
             "07": "grouped_query_attention = _gqa_07(True, True)\n"
                   "multi_query_attention = _mqa_07(grouped_query_attention)\n",
             "09": "apply_rope = _rope_09(True)\ngqa_rope_decode_step = _decode_09(apply_rope, 'btgd')\n"}[number]
    layout = {"C": "tbhd"}.get(code, "bthd")
    from test_grader_ex09 import ANSWER as ANSWER_09
    from test_grader_exercises import ANSWERS as INDEPENDENT

    rest = {"06": INDEPENDENT["06_kv_cache"].split("def decode_step")[0], "07": "",  # kv_cache_bytes, merge_partials
            "09": ANSWER_09[ANSWER_09.index("def merge_partials"):]}[number]
    source = ("import numpy as np\n\n" + rest + "\n" + "\n".join(inspect.getsource(f) for f in helpers) + "\n"
              + build.format(layout=layout))
    draws = Draws(sid, "roster", None, True)
    mine = grade_notebook(one_cell_notebook(tmp_path / f"{ex.key}.ipynb", ex.key, source), student=draws, limits=LIMITS)
    assert mine.score == mine.max_score and mine.variant == code, mine.text()
    assert f"graded as variant {code}" in mine.text()
    course = grade_notebook(ROOT / "solutions" / f"{ex.key}.ipynb", student=draws, limits=LIMITS)
    changed = [c for c in course.checks if c.score < c.max_score]
    assert changed, course.text()
    words = {"06": "the course's own layout", "07": "the course's own exercise", "09": "x[i + d/2]"}[number]
    assert any(words in c.output or "your variant" in c.output for c in changed), course.text()
    assert grade_notebook(ROOT / "solutions" / f"{ex.key}.ipynb", limits=LIMITS).score == course.max_score


def test_the_class_command_fixes_draws_and_grades_variants_by_the_roster(tmp_path, capsys):
    """--secret FILE and --variants: each row of the CSV names the student's variant and how the
    inputs were drawn; a secret too short to keep is refused before anything is graded."""
    from mhalib.grade.__main__ import main

    ex = registry.get("07")
    ids = _ids_by_variant(ex)
    for name in ("ada", "bob"):
        shutil.copy(ROOT / "solutions" / f"{ex.key}.ipynb", tmp_path / f"{name}.ipynb")
    (tmp_path / "roster.csv").write_text(f"submission,student_id\nada.ipynb,{ids['B']}\nbob.ipynb,{ids['C']}\n")
    (tmp_path / "secret").write_bytes(SECRET)
    (tmp_path / "short").write_bytes(b"1234")
    argv = [str(tmp_path / "ada.ipynb"), str(tmp_path / "bob.ipynb"), "--roster", str(tmp_path / "roster.csv"),
            "--csv", str(tmp_path / "grades.csv")]
    with pytest.raises(SystemExit) as refused:
        main(argv + ["--secret", str(tmp_path / "short")])
    assert refused.value.code == 2 and "at least 16" in capsys.readouterr().err
    assert main(argv + ["--secret", str(tmp_path / "secret"), "--variants"]) == 0
    import csv

    rows = {r["submission"].rsplit("/", 1)[-1]: r for r in csv.DictReader((tmp_path / "grades.csv").open())}
    assert rows["ada.ipynb"]["variant"] == "B" and rows["bob.ipynb"]["variant"] == "C"
    assert rows["ada.ipynb"]["seed"] == str(student_seed(SECRET, ids["B"], ex.key))
    assert all("fixed for student" in r["inputs"] and float(r["score"]) < 8 for r in rows.values()), rows
