"""Build the course site: the executed notebooks, the exercises and the guides as static pages.

    python tools/build_site.py              # writes build/site/ (what `make site` runs)
    python tools/build_site.py --out DIR

Open ``build/site/index.html`` in a browser, or copy the folder to any static host. The
site needs no network, at build time or when read: no script, font or style sheet comes
from elsewhere, and nothing is executed.

What it holds, in course order: the course map (the README's table), every notebook in
``notebooks/`` with its outputs as stored, every exercise of ``exercises/`` with the
command that grades it, the glossary, the instructors' guide, the list of graded
functions and the contributors' guide; a search page over all of them (a small index
in ``_static/search-index.js``, searched in the page); each page links the file it was
made from, copied beside it.

How it is made (the tool the Jupyter project keeps for this, nbconvert, which the
course already installs):

* notebook cells go through nbconvert's ``HTMLExporter`` with its ``lab`` cell markup
  and JupyterLab's style sheet, written once to ``_static/lab.css``; the page around
  them is ``tools/site/layout.html.j2`` (skip link, navigation, search, landmarks);
* maths (``$...$``, ``$$...$$``) becomes MathML at build time (latex2mathml), which
  browsers draw without a script, and which screen readers read;
* a figure's ``alt`` is the alternative text stored in its cell's metadata
  (``tools/alt_text.py``); the build stops on a figure without one;
* a widget (an explorer, a quiz, a progress bar) cannot work without a kernel. The
  site draws it as saved by ``tools/run_notebooks.py``: its controls as text, its
  messages, and the figure it had drawn (its first state), with a line that says it
  needs a kernel.
"""

from __future__ import annotations

import argparse
import html
import json
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from alt_text import WIDGET_VIEW, alt_texts, figures, widget_models  # noqa: E402

SITE_FILES = HERE / "site"
DEFAULT_OUT = ROOT / "build" / "site"
TITLE = "Multi-Head Attention, from one head to GQA"

__all__ = ["Page", "build", "course_pages", "latex_to_mathml", "slug", "main"]


# ------------------------------------------------------------------------------ maths

def _merge_upright_letters(mathml: str) -> str:
    """``\\mathrm{softmax}`` as one identifier, not six letters read one by one."""
    letter = r'<mi mathvariant="normal">([^<])</mi>'
    run = re.compile(r"<mrow>((?:%s){2,})</mrow>" % letter)
    return run.sub(lambda m: '<mi mathvariant="normal">%s</mi>' % "".join(re.findall(letter, m.group(1))),
                   mathml)


def latex_to_mathml(tex: str, display: bool = False) -> str:
    """LaTeX maths as MathML (browsers draw it without a script).

    Raises ``ValueError`` naming the expression when latex2mathml cannot read it.
    """
    from latex2mathml.converter import convert

    try:
        mathml = convert(tex.strip(), display="block" if display else "inline")
    except Exception as error:  # noqa: BLE001 - named with the expression, then stop
        raise ValueError(f"cannot convert the maths {tex!r} to MathML: {error}") from error
    mathml = _merge_upright_letters(mathml)
    # The source stays with it, for copying and for readers that do not speak MathML.
    return mathml.replace("<math ", f'<math alttext="{html.escape(tex.strip())}" ', 1)


def slug(text: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"<[^>]+>", "", html.unescape(text)).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _renderer_class():
    from nbconvert.filters.markdown_mistune import IPythonRenderer

    class SiteRenderer(IPythonRenderer):
        """nbconvert's Markdown renderer, with maths as MathML and GitHub's heading anchors."""

        def __init__(self, *args, github_anchors=False, **kwargs):
            super().__init__(*args, **kwargs)
            self.github_anchors = github_anchors
            self.seen_ids: dict[str, int] = {}

        def block_math(self, body):
            return latex_to_mathml(body, display=True)

        def inline_math(self, body):
            return latex_to_mathml(body)

        def latex_environment(self, name, body):
            return latex_to_mathml(f"\\begin{{{name}}}{body}\\end{{{name}}}", display=True)

        def multiline_math(self, text):
            return latex_to_mathml(text.strip().strip("$"), display=True)

        def heading(self, text, level, **attrs):
            if not self.github_anchors:
                return super().heading(text, level, **attrs)
            anchor = slug(text)
            n = self.seen_ids.get(anchor, 0)
            self.seen_ids[anchor] = n + 1
            anchor = anchor if n == 0 else f"{anchor}-{n}"
            return f'<h{level} id="{html.escape(anchor)}">{text}</h{level}>\n'

    return SiteRenderer


def markdown_to_html(source: str, *, github_anchors: bool = True) -> str:
    """A Markdown document (a guide, a README section) as HTML, maths as MathML."""
    from nbconvert.filters.markdown_mistune import MarkdownWithMath

    renderer = _renderer_class()(escape=False, github_anchors=github_anchors, exclude_anchor_links=True)
    return MarkdownWithMath(renderer=renderer).render(source)


# ------------------------------------------------------------------------------ pages

@dataclass
class Page:
    """One page of the site: where it comes from and where it goes."""

    kind: str  # "map", "notebook", "exercise", "doc", "search"
    title: str
    url: str  # relative to the site root, e.g. "notebooks/01_single_head_attention.html"
    source: Path | None = None  # the repository file it is made from
    rel: str = ""  # that file's path in the repository, e.g. "docs/glossary.md"
    nav_title: str = ""
    body: str = ""
    sections: list = field(default_factory=list)  # (anchor, heading, text) for the search index

    @property
    def source_url(self) -> str | None:
        """Where the copy of the source file sits in the site (beside the page)."""
        if self.source is None:
            return None
        return str(Path(self.url).parent / self.source.name) if self.kind in ("notebook", "exercise") \
            else f"source/{self.rel}"


def _notebook_title(path: Path) -> str:
    nb = json.loads(path.read_text(encoding="utf-8"))
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "markdown":
            src = "".join(cell.get("source", []))
            m = re.search(r"^#\s+(.+)$", src, re.M)
            if m:
                return m.group(1).strip()
    return path.stem.replace("_", " ")


DOCS = (
    ("docs/glossary.md", "glossary.html", "Glossary"),
    ("docs/instructors.md", "instructors.html", "Instructors' guide"),
    ("docs/exercises.md", "graded-functions.html", "Graded functions"),
    ("CONTRIBUTING.md", "contributing.html", "Contributing"),
)


def course_pages(root: Path = ROOT) -> list[Page]:
    """Every page of the site, in course order (the order of the navigation)."""
    pages = [Page("map", "Course map", "index.html", root / "README.md", nav_title="Course map")]
    for path in sorted((root / "notebooks").glob("*.ipynb")):
        title = _notebook_title(path)
        pages.append(Page("notebook", title, f"notebooks/{path.stem}.html", path, nav_title=title))
    for path in sorted((root / "exercises").glob("*.ipynb")):
        title = _notebook_title(path)
        pages.append(Page("exercise", title, f"exercises/{path.stem}.html", path, nav_title=title))
    for src, url, title in DOCS:
        if (root / src).exists():
            pages.append(Page("doc", title, url, root / src, nav_title=title))
    pages.append(Page("search", "Search", "search.html", nav_title="Search"))
    for page in pages:
        if page.source is not None:
            page.rel = page.source.relative_to(root).as_posix()
    return pages


def _link_map(pages: list[Page], root: Path) -> dict[str, str]:
    """Repository path of each source -> its page (relative to the site root)."""
    return {p.rel: p.url for p in pages if p.source is not None}


def _rewrite_links(body: str, page: Page, links: dict[str, str], root: Path) -> str:
    """Links between the course's files become links between its pages.

    A relative link to a file that has a page goes to that page (anchor kept); a relative
    link to any other file of the repository goes to the copy under ``source/``.
    """
    base = Path(page.rel).parent if page.rel else Path(".")
    here = Path(page.url).parent

    def fix(m):
        attr, url = m.group(1), html.unescape(m.group(2))
        parts = urlsplit(url)
        if parts.scheme or parts.netloc or url.startswith("#") or not parts.path:
            return m.group(0)
        norm = []  # the repository path, with "." and ".." resolved
        for part in (base / parts.path).parts:
            if part == "..":
                norm = norm[:-1]
            elif part != ".":
                norm.append(part)
        target = "/".join(norm)
        site = links.get(target)
        if site is None:
            site = f"source/{target}"
            _SOURCE_COPIES.add(target)
        rel = _relative(site, here)
        return f'{attr}="{html.escape(rel + ("#" + parts.fragment if parts.fragment else ""))}"'

    return re.sub(r'(href|src)="([^"]*)"', fix, body)


_SOURCE_COPIES: set[str] = set()


def _relative(target: str, here: Path) -> str:
    depth = len([p for p in here.parts if p not in ("", ".")])
    return "../" * depth + target


def _readme_course_map(root: Path) -> str:
    """The README's 'Course map' section, and its prerequisites line."""
    text = (root / "README.md").read_text(encoding="utf-8")
    m = re.search(r"^## Course map\n(.*?)(?=^## )", text, re.S | re.M)
    if not m:
        raise SystemExit("README.md has no '## Course map' section: the site's front page is made from it")
    intro = text.split("\n## ", 1)[0]  # the title and the paragraphs under it
    return intro + "\n## Course map\n" + m.group(1)


# ------------------------------------------------------------------------------ widgets

def _sanitize_html(value: str) -> str:
    """HTML of a saved widget (course code wrote it), with any script or handler removed."""
    import bleach
    from bleach.css_sanitizer import CSSSanitizer

    # An explorer's message carries its figure's alt text, hidden; the still's image has its own.
    value = re.sub(r'<span class="mhalib-figure-alt" hidden>.*?</span>', "", value, flags=re.S)
    tags = {"p", "b", "i", "em", "strong", "br", "ul", "ol", "li", "pre", "code", "span", "div", "table",
            "thead", "tbody", "tr", "th", "td", "sub", "sup", "small", "h3", "h4", "a"}
    return bleach.clean(value, tags=tags, attributes={"*": ["class"], "a": ["href"], "span": ["style"],
                                                       "ul": ["style"], "div": ["style"]},
                        css_sanitizer=CSSSanitizer(), strip=True)


def _option_label(state) -> str:
    labels = state.get("_options_labels") or []
    index = state.get("index")
    if isinstance(index, int) and 0 <= index < len(labels):
        return str(labels[index])
    return "" if index is None else str(index)


def _widget_html(model_id: str, models: dict, alts: list) -> str:
    """One saved widget as static HTML: text for controls, the figure for an Output."""
    model = models.get(model_id)
    if model is None:
        return ""
    name, state = model.get("model_name", ""), model.get("state", {})
    layout = models.get((state.get("layout") or "").replace("IPY_MODEL_", ""), {}).get("state", {})
    hidden = layout.get("display") == "none" or layout.get("visibility") == "hidden"
    desc = html.escape(str(state.get("description") or ""))
    if name in ("VBoxModel", "HBoxModel", "BoxModel", "GridBoxModel"):
        inner = "".join(_widget_html(c.replace("IPY_MODEL_", ""), models, alts)
                        for c in state.get("children", []))
        tag = "still-row" if name == "HBoxModel" else "still-column"
        return f'<div class="{tag}">{inner}</div>' if inner.strip() else ""
    if name == "OutputModel":
        parts = []
        for out in state.get("outputs", []):
            data = out.get("data", {})
            if "image/png" in data:
                alt = alts.pop(0)
                parts.append(f'<img src="data:image/png;base64,{data["image/png"]}" alt="{html.escape(alt)}">')
            elif "text/html" in data:
                parts.append(_sanitize_html("".join(data["text/html"])))
            elif "text/plain" in data:
                parts.append(f"<pre>{html.escape(''.join(data['text/plain']))}</pre>")
            elif out.get("output_type") == "stream":
                parts.append(f"<pre>{html.escape(''.join(out.get('text', '')))}</pre>")
        return f'<div class="still-output">{"".join(parts)}</div>' if parts else ""
    if hidden:
        return ""
    if name in ("HTMLModel", "HTMLMathModel"):
        value = _sanitize_html(str(state.get("value") or ""))
        return f'<div class="still-html">{value}</div>' if value.strip() else ""
    if name == "LabelModel":
        return f'<p class="still-html">{html.escape(str(state.get("value") or ""))}</p>'
    if name.endswith("SliderModel") or name in ("DropdownModel", "ToggleButtonsModel", "RadioButtonsModel",
                                                 "SelectModel", "CheckboxModel", "IntTextModel",
                                                 "FloatTextModel", "BoundedIntTextModel", "TextModel"):
        if "_options_labels" in state:
            value = _option_label(state)
        elif name == "CheckboxModel":
            value = "on" if state.get("value") else "off"
        elif isinstance(state.get("value"), list):
            value = " to ".join(str(v) for v in state["value"])
        else:
            value = str(state.get("value"))
        return f'<p class="still-control"><span>{desc or "value"}:</span> <strong>{html.escape(value)}</strong></p>'
    if name in ("FloatProgressModel", "IntProgressModel"):
        value, top = state.get("value", 0), state.get("max", 100)
        return f'<p class="still-control">{desc + ": " if desc else ""}{html.escape(str(value))} of {html.escape(str(top))}</p>'
    if name == "ButtonModel":
        return f'<span class="still-button">{desc}</span>'
    return ""


def widget_still(model_id: str, models: dict, alts: list) -> str:
    """The still of a saved widget, with the line that says it needs a kernel."""
    body = _widget_html(model_id, models, alts)
    model = models.get(model_id, {})
    classes = model.get("state", {}).get("_dom_classes") or []
    what = "explorer" if "mhalib-explorer" in classes else ("quiz" if "mhalib-quiz" in classes else "widget")
    note = {
        "explorer": "A still of this explorer as it first appears. Its controls need a running kernel: "
                    "open the notebook in JupyterLab (<code>make lab</code>) to use them.",
        "quiz": "This quiz checks answers with a running kernel: open the notebook in JupyterLab "
                "(<code>make lab</code>) to answer it.",
        "widget": "As saved when the notebook last ran. Widgets need a running kernel to change.",
    }[what]
    return (f'<figure class="widget-still widget-still-{what}">{body}'
            f'<figcaption class="still-note">{note}</figcaption></figure>')


# ------------------------------------------------------------------------------ notebooks

def _prepare(nb, rel: str):
    """Give each figure its alt text and replace each widget view by its still (in place).

    Raises ``SystemExit`` naming the cell when a figure has no alternative text.
    """
    import nbformat

    models = widget_models(nb)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        figs = figures(cell, models)
        alts = [a for a in alt_texts(cell) if isinstance(a, str) and a.strip()]
        if len(alts) != len(figs):
            raise SystemExit(
                f"{rel}: code cell {i + 1} (id {cell.get('id')}) shows {len(figs)} figure(s) but has "
                f"{len(alts)} alternative text(s) in its metadata; add them to tools/alt_text.py and run "
                "python tools/alt_text.py")
        queue = list(alts)
        outputs = []
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if "mhalib-slider-names" in "".join(data.get("text/html", "")):
                continue  # the script that names an explorer's sliders in JupyterLab: no explorer here
            if "image/png" in data:
                out.setdefault("metadata", {})["mhalib_alt"] = queue.pop(0)
            elif WIDGET_VIEW in data:
                still = widget_still(data[WIDGET_VIEW].get("model_id"), models, queue)
                out = nbformat.from_dict({"output_type": "display_data", "metadata": {},
                                          "data": {"text/html": still}})
            outputs.append(out)
        cell.outputs = outputs
    nb.metadata.pop("widgets", None)


def _exporter():
    from nbconvert import HTMLExporter

    renderer_class = _renderer_class()

    class SiteExporter(HTMLExporter):
        """nbconvert's HTML exporter: lab cell markup, maths as MathML, figures with alt."""

        def markdown2html(self, context, source):
            from nbconvert.filters.markdown_mistune import MarkdownWithMath

            cell = context.get("cell", {})
            renderer = renderer_class(escape=False, attachments=cell.get("attachments", {}),
                                      anchor_link_text=self.anchor_link_text,
                                      exclude_anchor_links=True)
            return MarkdownWithMath(renderer=renderer).render(source)

    from jinja2 import pass_context

    SiteExporter.markdown2html = pass_context(SiteExporter.markdown2html)
    return SiteExporter(template_name="lab", template_file="cells.html.j2",
                        extra_template_paths=[str(SITE_FILES)],
                        exclude_input_prompt=True, exclude_output_prompt=True)


def _notebook_body(page: Page, exporter) -> tuple[str, str]:
    """The cells of a notebook as HTML, and the style sheet of its code highlighting."""
    import nbformat

    nb = nbformat.read(page.source, as_version=4)
    _prepare(nb, page.rel)
    body, resources = exporter.from_notebook_node(nb, resources={"metadata": {"name": page.title}})
    css = "\n".join(resources.get("inlining", {}).get("css", []))
    return body, css


def _sections(body: str, page: Page) -> list:
    """(anchor, heading, text) per section of a page, for the search index."""
    parts = re.split(r"(<h[1-4][^>]*>.*?</h[1-4]>)", body, flags=re.S)
    sections, anchor, heading = [], "", page.title
    for part in parts:
        m = re.match(r"<h[1-4]([^>]*)>(.*?)</h[1-4]>", part, re.S)
        if m:
            idm = re.search(r'id="([^"]+)"', m.group(1))
            anchor = html.unescape(idm.group(1)) if idm else anchor
            heading = re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", "", m.group(2)))).strip().rstrip("¶")
            continue
        text = re.sub(r'<math [^>]*alttext="([^"]*)"[^>]*>.*?</math>', r" \1 ", part, flags=re.S)  # maths as TeX
        text = re.sub(r"<(script|style)[^>]*>.*?</\1>", " ", text, flags=re.S)
        text = re.sub(r'<img [^>]*alt="([^"]*)"[^>]*>', r" \1 ", text)
        text = re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", text))).strip()
        if text or heading:
            sections.append((anchor, heading, text[:4000]))
    return sections


# ------------------------------------------------------------------------------ the build

def build(out: Path = DEFAULT_OUT, root: Path = ROOT) -> list[Page]:
    """Write the whole site into ``out`` (emptied first). Returns the pages written."""
    import jinja2
    from markupsafe import Markup

    out = Path(out)
    if out.exists():
        shutil.rmtree(out)
    (out / "_static").mkdir(parents=True)
    pages = course_pages(root)
    links = _link_map(pages, root)
    _SOURCE_COPIES.clear()
    exporter = _exporter()
    highlight_css = ""

    for page in pages:
        if page.kind in ("notebook", "exercise"):
            page.body, css = _notebook_body(page, exporter)
            highlight_css = highlight_css or css
        elif page.kind == "map":
            page.body = markdown_to_html(_readme_course_map(root))
        elif page.kind == "doc":
            text = page.source.read_text(encoding="utf-8")
            page.body = markdown_to_html(text)
        if page.kind != "search":
            page.body = _rewrite_links(page.body, page, links, root)
            page.sections = _sections(page.body, page)

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(SITE_FILES)), autoescape=True,
                             keep_trailing_newline=True)
    layout = env.get_template("layout.html.j2")
    nav = [p for p in pages if p.kind != "search"]
    groups = [("Course", [p for p in nav if p.kind in ("map", "notebook")]),
              ("Exercises", [p for p in nav if p.kind == "exercise"]),
              ("Guides", [p for p in nav if p.kind == "doc"])]
    for page in pages:
        idx = nav.index(page) if page in nav else None
        prev_page = nav[idx - 1] if idx else None
        next_page = nav[idx + 1] if idx is not None and idx + 1 < len(nav) else None
        grade = f"make grade NB=exercises/{page.source.name}" if page.kind == "exercise" else None
        text = layout.render(
            site_title=TITLE, page=page, prefix=_relative("", Path(page.url).parent), groups=groups,
            prev_page=prev_page, next_page=next_page, grade=grade, body=Markup(page.body),
            source_url=page.source_url)
        target = out / page.url
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        if page.source is not None:
            copy = out / page.source_url
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(page.source, copy)

    for rel in sorted(_SOURCE_COPIES):
        src = root / rel
        if src.is_file():
            (out / "source" / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, out / "source" / rel)

    # One style sheet for every page: JupyterLab's (as nbconvert ships it) and the code colours.
    lab = Path(_lab_static())
    (out / "_static" / "lab.css").write_text(
        "\n".join((lab / name).read_text(encoding="utf-8") for name in ("index.css", "theme-light.css"))
        + "\n" + highlight_css, encoding="utf-8")
    for name in ("site.css", "search.js"):
        shutil.copyfile(SITE_FILES / name, out / "_static" / name)
    index = [{"t": p.title, "u": p.url + (f"#{a}" if a else ""), "s": h, "x": x}
             for p in pages for a, h, x in p.sections]
    (out / "_static" / "search-index.js").write_text(
        "window.COURSE_SEARCH_INDEX = " + json.dumps(index, ensure_ascii=False) + ";\n", encoding="utf-8")
    (out / ".nojekyll").write_text("")  # GitHub Pages: serve _static/ as it is
    return pages


def _lab_static() -> str:
    """Where nbconvert keeps its ``lab`` template's style sheets."""
    from nbconvert.exporters.templateexporter import TemplateExporter

    for base in TemplateExporter().template_paths:
        candidate = Path(base) / "static" / "index.css"
        if candidate.exists() and Path(base).name == "lab":
            return str(Path(base) / "static")
    from jupyter_core.paths import jupyter_path

    for base in jupyter_path("nbconvert", "templates", "lab", "static"):
        if (Path(base) / "index.css").exists():
            return base
    raise SystemExit("nbconvert's lab template (static/index.css) was not found; reinstall nbconvert")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Build the course site (static HTML) from the notebooks and docs.")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder to write (emptied first); "
                        "default build/site")
    args = parser.parse_args(argv)
    pages = build(args.out)
    counts = {k: sum(p.kind == k for p in pages) for k in ("notebook", "exercise", "doc")}
    out = args.out.resolve()
    shown = out.relative_to(Path.cwd()) if Path.cwd() in out.parents else out
    print(f"==> {shown}: {len(pages)} pages ({counts['notebook']} notebooks, {counts['exercise']} exercises, "
          f"{counts['doc']} guides, the course map and search); open {shown / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
