// The SDK against a running edge (started by the Rust test
// `web_sdk::the_typescript_sdk_passes_its_tests_against_a_live_edge`, which
// passes CELLMESH_EDGE, CELLMESH_TOKEN_A/B/OUTSIDER and
// CELLMESH_CONVERSATION): catch-up after being offline with no gap and no
// duplicate, a reload served from IndexedDB that resumes from its cursor,
// an offline send delivered exactly once, read receipts as counts, stable
// error reasons, and a gap in the stream filled from history.

import "fake-indexeddb/auto";
import assert from "node:assert/strict";
import { test } from "node:test";

import { CellmeshClient, CellmeshError, IndexedDbStore, MemoryStore } from "../src/index.js";

const edge = process.env.CELLMESH_EDGE ?? "";
const conversation = BigInt(process.env.CELLMESH_CONVERSATION ?? "0");
const [tokenA, tokenB, outsider] = ["A", "B", "OUTSIDER"].map((k) => process.env[`CELLMESH_TOKEN_${k}`] ?? "");

async function until(check: () => Promise<boolean>, ms = 15_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error("timed out");
    await new Promise((r) => setTimeout(r, 50));
  }
}

test("a device that was offline catches up in order, then a reload starts from IndexedDB and its cursor", async () => {
  assert.ok(edge, "CELLMESH_EDGE is set by the Rust test");
  const alice = new CellmeshClient({ edge, token: tokenA, store: new MemoryStore() });
  for (let i = 0; i < 60; i++) await alice.send(conversation, `offline ${i}`);

  const bobStore = await IndexedDbStore.open("bob");
  const bob = new CellmeshClient({ edge, token: tokenB, store: bobStore });
  bob.start();
  await until(async () => (await bobStore.maxSeq(conversation.toString())) >= 60);
  const all = await bobStore.page(conversation.toString(), Number.MAX_SAFE_INTEGER, 1000);
  assert.deepEqual(all.map((m) => m.seq), Array.from({ length: 60 }, (_, i) => i + 1), "no gap, no duplicate");
  assert.equal(all[59].body, "offline 59");
  await until(async () => (await bobStore.cursor()) !== undefined);
  await bob.stop();
  bobStore.close();

  // Reload: the first screen comes from IndexedDB even with no edge.
  const reloaded = await IndexedDbStore.open("bob");
  const offline = new CellmeshClient({ edge: "http://127.0.0.1:9", token: tokenB, store: reloaded });
  const screen = await offline.firstScreen(conversation);
  assert.equal(screen.length, 50);
  assert.equal(screen[49].seq, 60);

  // It resumes from its cursor: only what is new arrives.
  for (let i = 0; i < 5; i++) await alice.send(conversation, `later ${i}`);
  const seen: string[] = [];
  const resumed = new CellmeshClient({ edge, token: tokenB, store: reloaded, onChange: (c) => seen.push(...c) });
  resumed.start();
  await until(async () => (await reloaded.maxSeq(conversation.toString())) >= 65);
  await resumed.stop();
  assert.ok(seen.length >= 1 && seen.length <= 5, `events after the cursor only: ${seen.length}`);
  const page = await resumed.pageBack(conversation, 11, 10);
  assert.deepEqual(page.map((m) => m.seq), [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
  reloaded.close();
});

test("a send made offline is delivered exactly once after reconnecting", async () => {
  const store = await IndexedDbStore.open("alice-outbox");
  const offline = new CellmeshClient({ edge: "http://127.0.0.1:9", token: tokenA, store });
  await assert.rejects(offline.send(conversation, "sent while offline"));
  assert.equal((await store.outbox()).length, 1, "kept in the outbox");

  const online = new CellmeshClient({ edge, token: tokenA, store });
  const [first] = await online.flushOutbox();
  assert.equal((await store.outbox()).length, 0);
  // The same request again (a retry after a lost answer): the first answer.
  const entry = { clientReqId: "again-1", conversation: conversation.toString(), body: "once", createdAtMs: 1 };
  await store.putOutbox(entry);
  const [a] = await online.flushOutbox();
  await store.putOutbox(entry);
  const [b] = await online.flushOutbox();
  assert.equal(a.seq, b.seq);
  assert.equal(b.duplicate, true);
  const screen = await online.firstScreen(conversation, 100);
  assert.equal(screen.filter((m) => m.body === "sent while offline").length, 1);
  assert.equal(screen.filter((m) => m.body === "once").length, 1);
  assert.ok(first.seq > 0n);
  store.close();
});

test("read receipts come as counts, and a read counts at once", async () => {
  const alice = new CellmeshClient({ edge, token: tokenA, store: new MemoryStore() });
  const bob = new CellmeshClient({ edge, token: tokenB, store: new MemoryStore() });
  const seq = Number((await alice.send(conversation, "was this read?")).seq);
  const before = await alice.readCount(conversation, [seq]);
  assert.equal(before.read[0], 1, "only the sender has read it");
  await bob.markRead(conversation, seq);
  const after = await alice.readCount(conversation, [seq, seq + 1]);
  assert.deepEqual(after.read, [2, 0]);
  assert.equal(after.members, before.members);
  const stranger = new CellmeshClient({ edge, token: outsider, store: new MemoryStore() });
  const e = await stranger.readCount(conversation, [seq]).catch((e) => e);
  assert.equal(e.reason, "NOT_A_MEMBER");
});

test("errors carry the platform's stable reason", async () => {
  const stranger = new CellmeshClient({ edge, token: outsider, store: new MemoryStore() });
  const e = await stranger.send(conversation, "let me in").catch((e) => e);
  assert.ok(e instanceof CellmeshError);
  assert.equal(e.reason, "NOT_A_MEMBER");
  assert.equal(e.retryable, false);
  const forged = new CellmeshClient({ edge, token: "nonsense", store: new MemoryStore() });
  const f = await forged.firstScreen(conversation).catch((e) => e);
  assert.equal(f.reason, "MALFORMED_TOKEN");
});

test("a gap the stream shows is filled from history", async () => {
  // A device that holds seq 1 and whose cursor is at the end of its queue:
  // the next event skips everything in between.
  const store = new MemoryStore();
  const bob = new CellmeshClient({ edge, token: tokenB, store });
  await bob.pageBack(conversation, 2, 1);
  const at = await bob.sync.ack({ pts: 0n, queueId: 0n });
  await store.setCursor({ pts: at.latestPts.toString(), queueId: at.queueId.toString() });
  assert.equal(await store.maxSeq(conversation.toString()), 1);

  const alice = new CellmeshClient({ edge, token: tokenA, store: new MemoryStore() });
  const sent = await alice.send(conversation, "after the gap");
  bob.start();
  await until(async () => (await store.maxSeq(conversation.toString())) >= Number(sent.seq));
  await bob.stop();
  const all = await store.page(conversation.toString(), Number.MAX_SAFE_INTEGER, 10_000);
  assert.deepEqual(all.map((m) => m.seq), Array.from({ length: Number(sent.seq) }, (_, i) => i + 1));
});

test("polling (where a proxy holds streams back) brings every message once, in order", async () => {
  const store = new MemoryStore();
  const bob = new CellmeshClient({ edge, token: tokenB, store, transport: "poll", pollMs: 100 });
  bob.start();
  const alice = new CellmeshClient({ edge, token: tokenA, store: new MemoryStore() });
  let last = 0n;
  for (let i = 0; i < 30; i++) last = (await alice.send(conversation, `polled ${i}`)).seq;
  await until(async () => (await store.maxSeq(conversation.toString())) >= Number(last));
  assert.equal(bob.transport, "poll");
  await bob.stop();
  const polled = (await store.page(conversation.toString(), Number.MAX_SAFE_INTEGER, 10_000)).filter((m) => m.body.startsWith("polled "));
  assert.deepEqual(polled.map((m) => m.body), Array.from({ length: 30 }, (_, i) => `polled ${i}`));
  const at = await store.cursor();
  assert.ok(at && BigInt(at.pts) > 0n, "the cursor moved on");
});
