"""Short quizzes with checked answers: each wrong choice explains the misconception behind it.

Use in a notebook::

    from mhalib.quiz import quiz
    quiz("02")                 # every question of notebook 02, as buttons
    quiz("02.d_head")          # one question

and in plain Python (or a test)::

    from mhalib.quiz import grade_answer
    grade_answer("02.d_head", "A")      # Feedback(correct=True, message="Correct. ...")

The questions are data, in ``mhalib/data/quiz.json``: add one there with an id ``"NN.name"``
keyed by notebook number. A question has exactly one correct choice; every choice carries
``why``: the reason it is right, or the misconception that makes it tempting and why it is
wrong (both are checked when the file is read).

Only :func:`quiz` imports ipywidgets.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass

from mhalib.data import DATA_DIR

__all__ = ["Choice", "Question", "Feedback", "QUESTIONS", "questions", "grade_answer", "quiz"]


@dataclass(frozen=True)
class Choice:
    """One answer on offer: its ``text``, whether it is ``correct``, and ``why``."""

    text: str
    correct: bool = False
    why: str = ""


@dataclass(frozen=True)
class Question:
    """A multiple-choice question with exactly one correct :class:`Choice`."""

    id: str
    prompt: str
    choices: tuple

    def __post_init__(self):
        right = [c for c in self.choices if c.correct]
        if len(right) != 1:
            raise ValueError(f"question {self.id!r} needs exactly one correct choice; got {len(right)}")
        if any(not c.why for c in self.choices):
            raise ValueError(f"question {self.id!r}: every choice needs a 'why'")

    @property
    def answer(self) -> int:
        """Index of the correct choice."""
        return next(i for i, c in enumerate(self.choices) if c.correct)


@dataclass(frozen=True)
class Feedback:
    """The verdict on one answer: ``correct`` and a ``message`` in plain words."""

    correct: bool
    message: str


#: Every question, by id, in the order of ``mhalib/data/quiz.json``.
QUESTIONS: dict = {}


def _load(path=DATA_DIR / "quiz.json"):
    """Read the questions from their data file into :data:`QUESTIONS` (each checked by :class:`Question`)."""
    for q in json.loads(path.read_text(encoding="utf-8"))["questions"]:
        choices = tuple(Choice(c["text"], c["correct"], c["why"]) for c in q["choices"])
        question = Question(q["id"], q["prompt"], choices)
        if question.id in QUESTIONS:
            raise ValueError(f"question {question.id!r} appears twice in {path.name}")
        QUESTIONS[question.id] = question


_load()


def questions(prefix=""):
    """The questions whose id starts with ``prefix`` (e.g. ``"02"``), in the order added."""
    return [q for qid, q in QUESTIONS.items() if qid == prefix or qid.startswith(f"{prefix}.") or not prefix]


def _question(question):
    if isinstance(question, Question):
        return question
    if question in QUESTIONS:
        return QUESTIONS[question]
    raise ValueError(f"unknown question {question!r}; known: {', '.join(QUESTIONS)}")


def _index(q, answer):
    n = len(q.choices)
    letters = "ABCDEFGH"[:n]
    if isinstance(answer, bool):
        answer = None
    if isinstance(answer, int) and 0 <= answer < n:
        return answer
    if isinstance(answer, str):
        a = answer.strip()
        if len(a) == 1 and a.upper() in letters:
            return letters.index(a.upper())
        for i, c in enumerate(q.choices):
            if a == c.text:
                return i
    raise ValueError(
        f"answer {answer!r} is not one of the choices of question {q.id!r}; give an index "
        f"0 to {n - 1}, a letter {', '.join(letters)}, or the exact text of a choice"
    )


def grade_answer(question, answer) -> Feedback:
    """Check one answer.

    Args:
        question: a :class:`Question` or its id (a key of :data:`QUESTIONS`).
        answer: the index of the choice (0-based), its letter ("A", "b", ...), or its text.

    Returns:
        :class:`Feedback`: ``correct`` and a message; a wrong answer's message explains the
        misconception behind that choice.

    Raises:
        ValueError: unknown question, or an answer that names no choice.
    """
    q = _question(question)
    c = q.choices[_index(q, answer)]
    if c.correct:
        return Feedback(True, f"Correct. {c.why}")
    return Feedback(False, f"Not quite. {c.why}")


def _question_widget(q):
    import ipywidgets as w

    letters = "ABCDEFGH"
    listing = "".join(f"<li><b>{letters[i]}</b>. {html.escape(c.text)}</li>" for i, c in enumerate(q.choices))
    prompt = w.HTML(f"<p><b>{html.escape(q.prompt)}</b></p><ul style='list-style: none'>{listing}</ul>")
    feedback = w.HTML()
    feedback.add_class("mhalib-quiz-feedback")
    buttons = [w.Button(description=letters[i], tooltip=c.text, layout=w.Layout(width="48px"))
               for i, c in enumerate(q.choices)]

    def on_click(button):
        i = buttons.index(button)
        try:
            fb = grade_answer(q, i)
            colour = "#1a7f37" if fb.correct else "#9a6700"
            feedback.value = f"<p style='color:{colour}'>{letters[i]}: {html.escape(fb.message)}</p>"
        except Exception as exc:  # noqa: BLE001 - never a traceback in a widget
            feedback.value = f"<p>{html.escape(str(exc))}</p>"
        for b in buttons:
            b.button_style = ""
        button.button_style = "success" if q.choices[i].correct else "warning"

    for b in buttons:
        b.on_click(on_click)
    box = w.VBox([prompt, w.HBox(buttons), feedback])
    box.add_class("mhalib-quiz-question")
    return box


def quiz(*which):
    """Buttons for one or more questions; clicking a choice shows whether it is right and why.

    Args:
        which: question ids, id prefixes (``"02"`` for all of notebook 02) or
            :class:`Question` objects.

    Returns:
        An ipywidgets ``VBox`` (class ``mhalib-quiz``).
    """
    from mhalib.widgets.common import labelled_vbox

    qs = []
    for item in which:
        if isinstance(item, Question) or item in QUESTIONS:
            qs.append(_question(item))
        else:
            found = questions(item)
            if not found:
                raise ValueError(f"no question matches {item!r}; known: {', '.join(QUESTIONS)}")
            qs.extend(found)
    count = f"{len(qs)} question{'s' if len(qs) != 1 else ''}"
    box = labelled_vbox([_question_widget(q) for q in qs], f"[quiz, {count}; run the notebook to answer]")
    box.add_class("mhalib-quiz")
    return box
