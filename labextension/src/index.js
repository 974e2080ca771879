// The course's notebooks in JupyterLab, for a reader who uses a screen reader.
//
// JupyterLab 4.6 leaves four things unnamed or malformed in every notebook (axe-core,
// WCAG 2.1 A and AA, reports each as serious or critical); this extension mends them in
// each open notebook, and again whenever JupyterLab draws or redraws a cell:
//
// * an image output gets its alternative text: JupyterLab's image renderer never sets an
//   alt; the course keeps one text per figure in the cell's metadata,
//   {"mhalib": {"alt": ["...", ...]}} (tools/alt_text.py), in the order the cell shows
//   its figures; an image whose cell has no text is left without one, so that the
//   course's checks still see it;
// * each cell's editor (CodeMirror, role "textbox") is named "Code cell 3" (its kind and
//   its place in the notebook);
// * the button that folds a heading's section is named "Collapse section: <heading>", or
//   "Expand section: <heading>" while the section is folded;
// * each cell is an "article" of the cell list, which JupyterLab makes a "feed" (the
//   ARIA feed pattern: a feed holds articles), with its place and the number of cells.

import { INotebookTracker } from '@jupyterlab/notebook';

const WIDGET_VIEW = 'application/vnd.jupyter.widget-view+json';
const WIDGET_STATE = 'application/vnd.jupyter.widget-state+json';
const KINDS = { code: 'Code', markdown: 'Markdown', raw: 'Raw' };

function setAttr(element, name, value) {
  if (element.getAttribute(name) !== value) {
    element.setAttribute(name, value);
  }
}

/** The alternative texts stored in a cell's metadata, one per figure ([] when none). */
function altTexts(cellModel) {
  const meta = cellModel.getMetadata('mhalib');
  const alt = meta && meta.alt;
  if (typeof alt === 'string') {
    return [alt];
  }
  return Array.isArray(alt) ? alt : [];
}

/** The widget models saved in the notebook file ({} when none). */
function savedWidgetModels(notebookModel) {
  const widgets = notebookModel && notebookModel.getMetadata('widgets');
  const state = widgets && widgets[WIDGET_STATE];
  return (state && state.state) || {};
}

/**
 * How many figures the saved Output widgets of a widget tree hold (as tools/alt_text.py
 * counts them: the texts of a cell number these too, before the figures after them).
 */
function widgetFigures(modelId, models, seen) {
  if (!modelId || seen.has(modelId) || !models[modelId]) {
    return 0;
  }
  seen.add(modelId);
  const model = models[modelId];
  const state = model.state || {};
  let count = 0;
  if (model.model_name === 'OutputModel') {
    count += (state.outputs || []).filter((o) => o.data && o.data['image/png'] !== undefined).length;
  }
  for (const child of state.children || []) {
    if (typeof child === 'string' && child.startsWith('IPY_MODEL_')) {
      count += widgetFigures(child.slice('IPY_MODEL_'.length), models, seen);
    }
  }
  return count;
}

/** Give each image output of a code cell the text its cell's metadata holds for it. */
function labelImages(cell, models) {
  const area = cell.outputArea;
  if (!area || !area.model) {
    return;
  }
  const texts = altTexts(cell.model);
  let figure = 0;
  for (let i = 0; i < area.model.length; i++) {
    const data = area.model.get(i).data || {};
    if (data['image/png'] !== undefined) {
      const child = area.widgets[i];
      const img = child && child.node.querySelector('.jp-RenderedImage img');
      const text = texts[figure];
      if (img && typeof text === 'string' && text.trim()) {
        setAttr(img, 'alt', text);
      }
      figure += 1;
    } else if (data[WIDGET_VIEW]) {
      figure += widgetFigures(data[WIDGET_VIEW].model_id, models, new Set());
    }
  }
}

/** What a heading fold button folds: its cell's heading, as the reader sees it. */
function headingText(cell) {
  const heading = cell.node.querySelector('.jp-RenderedMarkdown :is(h1, h2, h3, h4, h5, h6)');
  if (heading) {
    const copy = heading.cloneNode(true);
    copy.querySelectorAll('.jp-InternalAnchorLink').forEach((a) => a.remove());
    const text = copy.textContent.replace(/\s+/g, ' ').trim();
    if (text) {
      return text;
    }
  }
  const info = cell.headingInfo;
  return (info && info.text) || 'this heading';
}

/** Mend every cell of a notebook that JupyterLab has drawn. */
function update(notebook) {
  const cells = notebook.widgets;
  const models = savedWidgetModels(notebook.model);
  cells.forEach((cell, index) => {
    if (!cell.model || cell.isDisposed) {
      return;
    }
    setAttr(cell.node, 'role', 'article');
    setAttr(cell.node, 'aria-posinset', String(index + 1));
    setAttr(cell.node, 'aria-setsize', String(cells.length));
    const input = cell.inputArea;
    if (input) {
      const name = `${KINDS[cell.model.type] || 'Cell'} cell ${index + 1}`;
      input.node.querySelectorAll('.cm-content').forEach((editor) => setAttr(editor, 'aria-label', name));
    }
    const buttons = cell.node.querySelectorAll('.jp-collapseHeadingButton');
    if (buttons.length) {
      const heading = headingText(cell);
      buttons.forEach((button) => {
        const folded = button.classList.contains('jp-mod-collapsed');
        setAttr(button, 'aria-label', `${folded ? 'Expand' : 'Collapse'} section: ${heading}`);
      });
    }
    if (cell.model.type === 'code') {
      labelImages(cell, models);
    }
  });
}

/** Mend a notebook now and after every change JupyterLab makes to its cells. */
function watch(panel) {
  const notebook = panel.content;
  let pending = 0;
  const schedule = () => {
    if (!pending) {
      pending = requestAnimationFrame(() => {
        pending = 0;
        if (!notebook.isDisposed) {
          update(notebook);
        }
      });
    }
  };
  // Cells attached or redrawn, outputs drawn, a section folded (a class changes): our own
  // changes are attributes other than class, so they do not wake the observer again.
  const observer = new MutationObserver(schedule);
  observer.observe(notebook.node, { childList: true, subtree: true, attributes: true, attributeFilter: ['class'] });
  notebook.modelContentChanged.connect(schedule);
  panel.disposed.connect(() => {
    observer.disconnect();
    if (pending) {
      cancelAnimationFrame(pending);
    }
  });
  schedule();
}

const plugin = {
  id: 'mha-course-a11y:plugin',
  description: 'Names and alternative texts for screen readers in the course notebooks.',
  autoStart: true,
  requires: [INotebookTracker],
  activate: (app, tracker) => {
    tracker.forEach(watch);
    tracker.widgetAdded.connect((_, panel) => watch(panel));
  }
};

export default plugin;
