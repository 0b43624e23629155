// The page of `s2s serve`: sentences in, the run's outputs out (a parse drawn as the tree the
// server sends as SVG), and the encoder-decoder attention of one sentence drawn as a heatmap.
// Plain script, no build step, nothing fetched from elsewhere.
"use strict";

const $ = (id) => document.getElementById(id);
let info = null;
let shown = null;  // the attention answer on screen

async function call(path, body) {
  const response = await fetch(path, body === undefined ? {} : {
    method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body)});
  const data = await response.json();
  if (!response.ok) throw new Error(data.error || response.statusText);
  return data;
}

function element(tag, className, text) {
  const e = document.createElement(tag);
  if (className) e.className = className;
  if (text !== undefined) e.textContent = text;
  return e;
}

function showError(message) {
  $("error").textContent = message;
  $("error").hidden = !message;
}

async function loadInfo() {
  info = await call("info");
  const task = info.default_task;
  $("run").textContent = `${info.run_dir} \u2014 ${info.checkpoint.split("/").pop()} \u2014 ` +
    `tasks: ${info.tasks.join(", ")} \u2014 ${info.threads} thread(s)`;
  if (info.tasks.length > 1) {
    $("task-label").hidden = false;
    for (const name of info.tasks) $("task").append(new Option(name, name, false, name === task));
  }
  const beam = Math.min(...Object.values(info.limits.nbest));  // the n best: at most the beam
  for (let n = 2; n <= Math.min(beam, 8); n++) $("nbest").append(new Option(`${n} best`, n));
  for (let layer = 1; layer <= info.layers; layer++) {
    $("layer").append(new Option(`${layer} of ${info.layers}`, layer, false, layer === info.layers));
  }
}

function selectedTask() {
  return info && info.tasks.length > 1 ? $("task").value : undefined;
}

async function run(event) {
  event.preventDefault();
  const lines = $("text").value.split("\n").map((l) => l.trim()).filter((l) => l);
  if (!lines.length) { showError("type a sentence first"); return; }
  showError("");
  $("results").replaceChildren();  // what is shown is always the answer to what is typed
  $("heatmap").replaceChildren();
  $("run-button").disabled = true;
  $("status").textContent = "decoding\u2026";
  try {
    const nbest = Number($("nbest").value);
    const answer = await call("generate", {text: lines, task: selectedTask(), nbest: nbest > 1 ? nbest : undefined});
    render(lines, answer);
    $("status").textContent = `${lines.length} sentence(s) in ${answer.timing.total_ms.toFixed(0)} ms`;
    await attention(lines[0]);
  } catch (e) {
    showError(e.message);
    $("status").textContent = "";
  } finally {
    $("run-button").disabled = false;
  }
}

function render(lines, answer) {
  const results = $("results");
  results.replaceChildren();
  answer.hypotheses.forEach((hyp, i) => {
    const box = element("div", "result");
    box.append(element("div", "source", lines[i]));
    box.append(element("div", "output", hyp));
    if (answer.unknown_words[i].length) {
      box.append(element("div", "unknown", "never seen in training (read as <unk>): " +
                                           answer.unknown_words[i].join(", ")));
    }
    box.append(element("div", "meta", `score ${answer.scores[i].toFixed(3)} (log-probability / length penalty)`));
    if (answer.nbest) {  // the n best outputs, best first, each with the search's score
      const list = element("ol", "nbest");
      for (const out of answer.nbest[i]) {
        const item = element("li", "", out.output);
        item.append(element("span", "meta", ` ${out.score.toFixed(3)}`));
        list.append(item);
      }
      box.append(list);
    }
    if (answer.trees[i]) {  // the server's drawing of a bracketed output: its text is escaped there
      const tree = element("div", "tree");
      tree.innerHTML = answer.trees[i];
      box.append(tree);
    }
    const button = element("button", "", "attention");
    button.type = "button";
    button.addEventListener("click", () => attention(lines[i]).catch((e) => showError(e.message)));
    box.append(button);
    results.append(box);
  });
}

async function attention(sentence) {
  shown = await call("attention", {text: sentence, task: selectedTask(), layer: Number($("layer").value)});
  shown.sentence = sentence;
  const head = $("head");
  const chosen = head.value;
  head.replaceChildren(new Option("mean of all", "mean"));
  for (let h = 1; h <= shown.heads; h++) head.append(new Option(String(h), h, false, String(h) === chosen));
  $("attention-of").textContent = `\u2014 layer ${shown.layer}: \u201c${sentence}\u201d`;
  $("attention").hidden = false;
  drawHeatmap();
}

// viridis, five stops
const STOPS = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];

function colour(w) {
  const x = Math.sqrt(Math.min(1, Math.max(0, w))) * (STOPS.length - 1);
  const i = Math.min(STOPS.length - 2, Math.floor(x));
  const t = x - i;
  const c = STOPS[i].map((v, k) => Math.round(v + t * (STOPS[i + 1][k] - v)));
  return `rgb(${c[0]},${c[1]},${c[2]})`;
}

function drawHeatmap() {
  const NS = "http://www.w3.org/2000/svg";
  const which = $("head").value;
  const heads = which === "mean" ? shown.weights : [shown.weights[Number(which) - 1]];
  const rows = shown.output_tokens, cols = shown.source_tokens;
  const cell = 22, left = 8 + 7.5 * Math.max(...rows.map((t) => t.length)), top = 8 + 6 * Math.max(...cols.map((t) => t.length));
  const svg = document.createElementNS(NS, "svg");
  svg.setAttribute("class", "heatmap");
  svg.setAttribute("width", left + cols.length * cell + 10);
  svg.setAttribute("height", top + rows.length * cell + 10);
  svg.setAttribute("font-family", "sans-serif");
  svg.setAttribute("font-size", "12");
  const add = (tag, attributes, text) => {
    const e = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attributes)) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    svg.append(e);
    return e;
  };
  rows.forEach((token, r) => {
    add("text", {x: left - 6, y: top + r * cell + cell * 0.68, "text-anchor": "end"}, token);
    cols.forEach((_, c) => {
      const w = heads.reduce((sum, h) => sum + h[r][c], 0) / heads.length;
      add("rect", {x: left + c * cell, y: top + r * cell, width: cell - 1, height: cell - 1, fill: colour(w)})
        .append(Object.assign(document.createElementNS(NS, "title"), {textContent: `${token} \u2192 ${cols[c]}: ${w.toFixed(3)}`}));
    });
  });
  cols.forEach((token, c) => {
    const x = left + c * cell + cell * 0.6, y = top - 6;
    add("text", {x, y, transform: `rotate(-60 ${x} ${y})`}, token);
  });
  $("heatmap").replaceChildren(svg);
}

$("form").addEventListener("submit", run);
$("layer").addEventListener("change", () => shown && attention(shown.sentence).catch((e) => showError(e.message)));
$("head").addEventListener("change", () => shown && drawHeatmap());
loadInfo().catch((e) => showError(`cannot read /info: ${e.message}`));
