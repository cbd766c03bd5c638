#!/usr/bin/env node
// A Node.js client of the actors engine that speaks only the wire protocol
// (docs/protocol/asyncapi.yaml): no Python, no CLI. It registers examples/hello.yaml,
// starts one execution by a JetStream publish to `start` and one by a request on
// `start.request`, watches their statuses (KV bucket `status` and the
// `status.<playbook>.*` feed), reads their results on `result.request`, and shows a
// start the starters refuse.
//
//   node client.mjs --server nats://127.0.0.1:4222 [--name NAME] [--file ../hello.yaml] [--timeout 60]
//
// Credentials as actors-cli reads them (docs/security.md), never from the command line:
// NATS_USER with NATS_PASSWORD or NATS_PASSWORD_FILE, or NATS_TOKEN or NATS_TOKEN_FILE;
// NATS_INBOX_PREFIX for a user whose replies must arrive under its own inbox prefix.
//
// Prints one JSON line per step: {"registered": ...}, {"refused": ...}, then per execution
// {"execution_id", "state", "result", "started_by", "statuses" (seen in KV), "feed"}. Exit 0 when both
// executions COMPLETED; otherwise the error on stderr and exit 1.

import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { basename } from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";

import { JetStreamApiError, jetstream } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import { connect, errors, headers } from "@nats-io/transport-node";

const TERMINAL = new Set(["COMPLETED", "FAILED", "CANCELLED"]);
const RESULT_WAIT = 30; // seconds the engine may hold a result request (the protocol caps it at 60)

const { values: opts } = parseArgs({
  options: {
    server: { type: "string", default: process.env.NATS_URL ?? "nats://127.0.0.1:4222" },
    name: { type: "string", default: "node" },
    file: { type: "string", default: fileURLToPath(new URL("../hello.yaml", import.meta.url)) },
    timeout: { type: "string", default: "60" },
  },
});

// A secret from the environment, or from the file another variable names (a mounted Secret).
function secret(name) {
  const file = process.env[`${name}_FILE`];
  return file ? readFileSync(file, "utf8").replace(/\r?\n$/, "") : process.env[name];
}

const encode = (value) => new TextEncoder().encode(JSON.stringify(value));
const decode = (msg) => msg.json();
const print = (value) => console.log(JSON.stringify(value));
const pause = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// Resolves once; `promise` is awaited by whoever needs the event.
function deferred() {
  let resolve;
  const promise = new Promise((r) => (resolve = r));
  return { promise, resolve };
}

// An at-most-once notification may never come: wait for it, but not for ever.
const within = (promise, ms) => Promise.race([promise, pause(ms).then(() => undefined)]);

// A reply whose `error` is set is a refusal: its type says why (docs/protocol).
const refused = (what, error) => new Error(`${what}: ${error.type}: ${error.message}`);

// A core NATS request, asked again with the same body when no answer comes in time or
// the answer is a `retryable` error. Safe because every request here is idempotent:
// a start names its execution id, and registering the same source again returns its version.
async function ask(nc, subject, body, { timeout = 10_000, headers: h, budgetMs = 30_000 } = {}) {
  const deadline = Date.now() + budgetMs;
  for (let wait = 100; ; wait = Math.min(wait * 2, 2000)) {
    let reply;
    try {
      reply = (await nc.request(subject, encode(body), { timeout, headers: h })).json();
    } catch (e) {
      // no responders: nobody serves `subject` (no engine or starter running): not retried
      if (!(e instanceof errors.TimeoutError) || Date.now() > deadline) {
        throw new Error(`${subject}: ${e.message}`);
      }
      continue;
    }
    if (!reply.error?.retryable || Date.now() + wait > deadline) return reply;
    await pause(wait);
  }
}

// catalog.register: the playbook's YAML text in, its catalog path and version out.
async function register(nc, file) {
  const source = await readFile(file, "utf8");
  const reply = await ask(nc, "catalog.register", { source, file: basename(file) });
  if (reply.error) throw refused("register", reply.error);
  return reply; // RegisterReply {path, version, registered, error}
}

// `start` on stream START. The execution id is chosen once and sent as Nats-Msg-Id too:
// a re-send after a timeout (or a 503 while the stream elects a leader) is then dropped
// as a duplicate, never a second execution (docs/client.md, "Publishing start messages").
async function publishStart(js, start, budgetMs = 30_000) {
  const deadline = Date.now() + budgetMs;
  for (let wait = 100; ; wait = Math.min(wait * 2, 2000)) {
    try {
      return await js.publish("start", encode(start), { msgID: start.execution_id, timeout: 5000 });
    } catch (e) {
      const transient =
        e instanceof errors.TimeoutError ||
        e.name === "JetStreamNotEnabled" || // no responders: the stream has no leader right now
        (e instanceof JetStreamApiError && e.code === 503);
      if (!transient || Date.now() + wait > deadline) throw e;
      await pause(wait);
    }
  }
}

// `start.request`: answered by a starter once the start record is written, or refused.
// The reply is a StartReply {execution_id, started, existing, error}.
const requestStart = (nc, start) => ask(nc, "start.request", start);

// `result.request` with `Actors-Result-Wait`: the engine answers once the execution has
// ended (or the wait is over), with its status and result.
async function requestResult(nc, executionId) {
  const h = headers();
  h.set("Actors-Result-Wait", String(RESULT_WAIT));
  const reply = await ask(nc, "result.request", { execution_id: executionId }, {
    timeout: (RESULT_WAIT + 5) * 1000,
    headers: h,
  });
  if (reply.error) throw refused(`result of ${executionId}`, reply.error);
  return reply; // ResultReply {execution_id, status, result, result_ref, error}
}

async function main() {
  const nc = await connect({
    servers: opts.server.split(","),
    user: process.env.NATS_USER,
    pass: secret("NATS_PASSWORD"),
    token: secret("NATS_TOKEN"),
    inboxPrefix: process.env.NATS_INBOX_PREFIX,
    timeout: 10_000,
  });
  try {
    const js = jetstream(nc);
    const entry = await register(nc, opts.file);
    print({ registered: { path: entry.path, version: entry.version } });

    const byPublish = `node-pub-${randomUUID()}`;
    const byRequest = `node-req-${randomUUID()}`;
    const seen = new Map(
      [byPublish, byRequest].map((id) => [
        id,
        { statuses: [], feed: [], first: deferred(), ended: deferred(), feedEnded: deferred() },
      ]),
    );

    // Watch before starting, so no status is missed. KV `status`: key = execution id,
    // value = ExecutionStatus JSON; no key yet = the start is still queued (never PENDING).
    const kv = await new Kvm(js).open("status");
    const watch = await kv.watch({ key: [...seen.keys()] });
    (async () => {
      for await (const e of watch) {
        if (e.operation !== "PUT") continue;
        const status = e.json();
        const s = seen.get(e.key);
        s.statuses.push(status.state);
        s.first.resolve();
        if (TERMINAL.has(status.state)) s.ended.resolve(status);
      }
    })().catch((e) => fail(`status watch: ${e.message}`));
    // The feed `status.<playbook>.<execution_id>`: every status of one playbook's
    // executions, on core NATS (at most once: KV stays the record).
    const feed = nc.subscribe(`status.${entry.path}.*`, {
      callback: (err, msg) => {
        if (err) return;
        const status = decode(msg);
        const s = seen.get(status.execution_id);
        if (!s) return; // another client's execution of the same playbook
        s.feed.push(status.state);
        if (TERMINAL.has(status.state)) s.feedEnded.resolve();
      },
    });
    await nc.flush(); // the server has the subscription before any start is sent

    const payload = { name: opts.name };
    const playbook = { playbook: entry.path, version: entry.version };
    await publishStart(js, { ...playbook, payload, execution_id: byPublish });
    const reply = await requestStart(nc, { ...playbook, payload, execution_id: byRequest });
    if (!reply.started) throw refused("start", reply.error);

    // A start the starters refuse: an unknown playbook is answered at once, and nothing runs.
    const unknown = `examples/no-such-playbook-${randomUUID().slice(0, 8)}`;
    const bad = await requestStart(nc, { playbook: unknown, execution_id: `node-bad-${randomUUID()}` });
    print({ refused: { execution_id: bad.execution_id, started: bad.started, error: bad.error } });

    let ok = true;
    for (const [id, startedBy] of [[byPublish, "publish"], [byRequest, "request"]]) {
      const s = seen.get(id);
      await s.first.promise; // the key exists: the start record is written
      const answer = await requestResult(nc, id);
      if (!answer.status || !TERMINAL.has(answer.status.state)) {
        throw new Error(`${id} did not end within ${RESULT_WAIT}s`);
      }
      await s.ended.promise; // the watch delivers the terminal status too
      await within(s.feedEnded.promise, 5000);
      const line = { execution_id: id, state: answer.status.state, result: answer.result, started_by: startedBy };
      if (answer.result_ref) line.result_ref = answer.result_ref; // too big for a reply: object store `blobs`
      if (answer.status.error) line.error = answer.status.error;
      print({ ...line, statuses: s.statuses, feed: s.feed });
      ok &&= answer.status.state === "COMPLETED";
    }
    watch.stop();
    feed.unsubscribe();
    if (!ok) console.error("error: an execution did not complete");
    return ok ? 0 : 1;
  } finally {
    await nc.close();
  }
}

function fail(message) {
  console.error(`error: ${message}`);
  process.exit(1);
}

setTimeout(() => fail(`not done within ${opts.timeout}s`), Number(opts.timeout) * 1000).unref();
main().then((code) => process.exit(code), (e) => fail(e.message));
