// Search over the course site, in the page: the index is window.COURSE_SEARCH_INDEX
// (written by tools/build_site.py), one entry per section of each page. No network.
(function () {
  "use strict";
  const index = window.COURSE_SEARCH_INDEX || [];
  const params = new URLSearchParams(window.location.search);
  const query = (params.get("q") || "").trim();
  const box = document.getElementById("search-box");
  const status = document.getElementById("search-status");
  const list = document.getElementById("search-results");
  if (box) box.value = query;
  if (!query || !status || !list) return;
  const words = query.toLowerCase().split(/\s+/).filter(Boolean);
  const count = (text, word) => { let n = 0, i = -1; while ((i = text.indexOf(word, i + 1)) !== -1) n++; return n; };
  const hits = [];
  for (const entry of index) {
    const title = (entry.t + " " + entry.s).toLowerCase();
    const text = entry.x.toLowerCase();
    let score = 0, all = true;
    for (const w of words) {
      const n = 5 * count(title, w) + count(text, w);
      if (!n) { all = false; break; }
      score += n;
    }
    if (all) hits.push({ entry, score });
  }
  hits.sort((a, b) => b.score - a.score);
  const shown = hits.slice(0, 50);
  const para = document.createElement("p");
  para.textContent = hits.length
    ? `${hits.length} section${hits.length === 1 ? "" : "s"} match "${query}"` + (hits.length > shown.length ? `; the best ${shown.length} are listed.` : ".")
    : `No section matches "${query}". Try fewer or other words.`;
  status.replaceChildren(para);
  for (const { entry } of shown) {
    const li = document.createElement("li");
    const a = document.createElement("a");
    a.href = entry.u;
    a.textContent = entry.s && entry.s !== entry.t ? `${entry.s}` : entry.t;
    const where = document.createElement("div");
    where.className = "where";
    where.textContent = entry.t;
    const snippet = document.createElement("div");
    const low = entry.x.toLowerCase();
    const at = Math.max(0, low.indexOf(words[0]) - 80);
    snippet.textContent = (at > 0 ? "…" : "") + entry.x.slice(at, at + 240) + (entry.x.length > at + 240 ? "…" : "");
    li.append(a, where, snippet);
    list.append(li);
  }
})();
