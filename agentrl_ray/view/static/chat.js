// A conversation as chat: one bubble per message, tool calls under the assistant's text, tool results in their own
// bubbles (red when the env host reported an error: its results then start with "Error: "), and a line of
// metadata (reward and its parts, finish reason, errors). Text goes in through textContent only: what a model or a
// tool wrote is never parsed as HTML.
"use strict";

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined && text !== null) node.textContent = text;
  return node;
}

function fmt(x, digits = 3) {
  return typeof x === "number" ? (Number.isInteger(x) ? String(x) : x.toFixed(digits)) : String(x);
}

// `version`: the weights version that sampled an assistant turn (the stream pipeline can change it between turns).
function messageNode(m, version) {
  const isError = m.role === "tool" && typeof m.content === "string" && m.content.startsWith("Error: ");
  const node = el("div", `msg ${m.role}${isError ? " error" : ""}`);
  const role = m.role === "tool" && m.name ? `tool result (${m.name})` : m.role;
  node.appendChild(el("span", "role", version !== undefined ? `${role} (weights v${version})` : role));
  if (m.content) node.appendChild(el("span", "text", m.content));
  for (const call of m.tool_calls || []) {
    const f = call.function || {};
    node.appendChild(el("span", "call", `tool call: ${f.name}(${f.arguments})`));
  }
  return node;
}

// `r`: a rollouts/ trace record (prompt + completion) or an eval transcript (messages).
function conversationNode(r) {
  const errors = (r.num_tool_errors ?? r.tool_errors ?? 0) + (r.num_step_errors ?? 0);
  const failed = errors > 0 || r.finish_reason === "length";
  const node = el("div", failed ? "conv err" : "conv");
  const parts = Object.entries(r.reward_parts || {}).map(([k, v]) => `${k} ${fmt(v)}`).join(", ");
  const meta = [
    r.step !== undefined ? `step ${r.step}` : null,
    `prompt ${r.prompt_id ?? r.id}`,
    `sample ${r.sample_index ?? r.sample}`,
    `reward ${fmt(r.reward)}` + (parts ? ` (${parts})` : ""),
    r.answer !== undefined ? `answer ${r.answer}` : null,
    r.columns && r.columns.answer !== undefined ? `answer ${r.columns.answer}` : null,
    `finish ${r.finish_reason}`,
    `tool calls ${r.num_tool_calls ?? r.tool_calls ?? 0}`,
    `errors ${errors}`,
    r.turn_versions && r.turn_versions.length ? `weights v${r.turn_versions.join("→")}` : null,
  ].filter((x) => x !== null);
  node.appendChild(el("div", "meta", meta.join(" | ")));
  const versions = r.turn_versions || [];
  for (const m of r.messages || r.prompt || []) node.appendChild(messageNode(m));
  let turn = 0;
  for (const m of r.messages ? [] : r.completion || []) {
    node.appendChild(messageNode(m, m.role === "assistant" ? versions[turn++] : undefined));
  }
  return node;
}

function renderConversations(container, records) {
  container.replaceChildren(...records.map(conversationNode));
}
