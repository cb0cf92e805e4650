// A small agent harness in Node (no packages: Node's own fetch and child_process), for the
// probe's tests. It is not fakeagent.py: it keeps a transcript of its own kind and has its
// own ways of coming back after a crash, chosen with --style:
//
//   words    appends every message to transcript.jsonl (fsynced); a call left without a
//            result is answered, on resume, with an honest report in words of its own
//            ("[tool result unavailable: ...]"), never run again.
//   fresh    the same journal, but a resume starts a fresh conversation: one user message
//            summarising each call and its result, the unfinished one marked
//            "interrupted, outcome unknown".
//   reask    journals the ids of the calls it started; on resume it drops an unfinished
//            call and asks the model again. A call whose id it started before is reported
//            ("call was cut off"); one with a new id runs.
//   inplace  keeps the transcript as one JSON document rewritten in place after every
//            message (truncate, then write, then fsync). A document that does not parse
//            (a kill between the truncate and the write) is taken as no transcript at all:
//            the task starts over.
//
// Usage: node nodeagent.mjs --style S --model-url URL --state DIR [--prompt P] [--resume]

import { spawnSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";

const argv = process.argv.slice(2);
const opt = (name, dflt) => {
  const i = argv.indexOf(name);
  return i >= 0 ? argv[i + 1] : dflt;
};
const style = opt("--style", "words");
const url = opt("--model-url");
const state = opt("--state");
const prompt = opt("--prompt", "go");

const TOOLS = [{
  type: "function",
  function: {
    name: "bash",
    description: "Run a shell command in the working directory",
    parameters: { type: "object", properties: { command: { type: "string" } }, required: ["command"] },
  },
}];

function syncedAppend(file, line) {
  const fresh = !fs.existsSync(file);
  const fd = fs.openSync(file, "a");
  try {
    fs.writeSync(fd, line + "\n");
    fs.fsyncSync(fd);
  } finally {
    fs.closeSync(fd);
  }
  if (fresh) { // the new file's name is durable once its directory is
    const d = fs.openSync(path.dirname(file), "r");
    try { fs.fsyncSync(d); } finally { fs.closeSync(d); }
  }
}

function readLines(file) {
  if (!fs.existsSync(file)) return [];
  const out = [];
  for (const line of fs.readFileSync(file, "utf8").split("\n")) {
    if (!line) continue;
    try { out.push(JSON.parse(line)); } catch { break; } // a torn last line
  }
  return out;
}

// --- the transcript: a journal of lines, or one document rewritten in place ---
const journal = path.join(state, "transcript.jsonl");
const doc = path.join(state, "transcript.json");

function load() {
  if (style !== "inplace") return readLines(journal).filter((e) => e.message).map((e) => e.message);
  if (!fs.existsSync(doc)) return [];
  try {
    return JSON.parse(fs.readFileSync(doc, "utf8")).messages;
  } catch {
    return []; // cut between the truncate and the write: nothing to go on
  }
}

function save(messages, msg) {
  messages.push(msg);
  if (style !== "inplace") return syncedAppend(journal, JSON.stringify({ message: msg }));
  const fd = fs.openSync(doc, "w"); // O_TRUNC: the old document is gone from here on
  try {
    fs.writeSync(fd, JSON.stringify({ messages }));
    fs.fsyncSync(fd);
  } finally {
    fs.closeSync(fd);
  }
}

async function ask(messages) {
  const r = await fetch(`${url}/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: "Bearer none" },
    body: JSON.stringify({ model: "fake", messages, tools: TOOLS }),
  });
  if (!r.ok) throw new Error(`the model answered HTTP ${r.status}`);
  return (await r.json()).choices[0].message;
}

function bash(command) {
  const p = spawnSync("/bin/sh", ["-c", command], { encoding: "utf8" });
  return (p.stdout || "") + (p.stderr || "") + (p.status ? `\n[exit ${p.status}]` : "");
}

const REPORT = "[tool result unavailable: the agent restarted before this call returned; " +
  "check the workspace before retrying]";

async function main() {
  fs.mkdirSync(state, { recursive: true });
  const started = path.join(state, "started.jsonl");
  const startedIds = new Set(readLines(started).map((e) => e.id));
  let messages = load();
  if (messages.length === 0) {
    messages = [];
    save(messages, { role: "user", content: prompt });
  }
  // the calls of the last assistant message that have no result yet
  let pending = [];
  const last = messages.map((m) => m.role).lastIndexOf("assistant");
  if (last >= 0) {
    const answered = new Set(messages.slice(last + 1).map((m) => m.tool_call_id));
    pending = (messages[last].tool_calls || []).filter((c) => !answered.has(c.id));
  }
  if (pending.length && style === "reask") {
    messages = messages.slice(0, last); // forget the unfinished call: ask again
    pending = [];
  } else if (pending.length && style === "fresh") {
    // a conversation that already began with a summary keeps it
    const head = messages[0] && messages[0].role === "user" ? messages[0].content : prompt;
    const lines = ["You were restarted. What happened since:"];
    const results = new Map(messages.filter((m) => m.role === "tool").map((m) => [m.tool_call_id, m.content]));
    let i = 0;
    for (const m of messages) {
      for (const c of m.tool_calls || []) {
        const got = results.has(c.id) ? results.get(c.id) : "interrupted, outcome unknown";
        lines.push(`${++i}. ${c.function.name} ${c.function.arguments} -> ${got}`);
      }
    }
    messages = [];
    save(messages, { role: "user", content: `${head}\n\n${lines.join("\n")}` });
    pending = [];
  } else {
    for (const c of pending) save(messages, { role: "tool", tool_call_id: c.id, content: REPORT });
    pending = [];
  }
  for (;;) {
    const reply = await ask(messages);
    const msg = { role: "assistant", content: reply.content ?? null };
    if (reply.tool_calls && reply.tool_calls.length) msg.tool_calls = reply.tool_calls;
    save(messages, msg);
    if (!msg.tool_calls) return 0;
    for (const c of msg.tool_calls) {
      let out;
      if (style === "reask" && startedIds.has(c.id)) {
        out = "call was cut off";
      } else {
        syncedAppend(started, JSON.stringify({ id: c.id }));
        startedIds.add(c.id);
        out = bash(JSON.parse(c.function.arguments).command);
      }
      save(messages, { role: "tool", tool_call_id: c.id, content: out });
    }
  }
}

main().then((code) => process.exit(code), (e) => {
  console.error(`nodeagent: ${e.message}`);
  process.exit(1);
});
