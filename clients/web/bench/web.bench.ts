// The web app's figures in headless Chromium against a `cellmesh dev`
// deployment (`scripts/bench-web.sh` starts it and passes its dev.json):
// the first screen after a reload with a warm IndexedDB and on a fresh
// profile (cold), send -> rendered on another user's page across regions,
// and the page's memory and DOM size after MESSAGES messages in one
// conversation. Prints the percentiles and writes JSON.

import { readFileSync, writeFileSync } from "node:fs";
import puppeteer, { type Browser, type Page } from "puppeteer-core";

const [devJson, out] = [process.argv[2], process.argv[3] ?? "web-bench.json"];
const raw = readFileSync(devJson, "utf8");
const dev = JSON.parse(raw);
const RUNS = Number(process.env.RUNS ?? 30);
const SENDS = Number(process.env.SENDS ?? 300);
const MESSAGES = Number(process.env.MESSAGES ?? 10_000);
// Ids are 64-bit: read from the text, not through a JS number.
const conversation = /"conversations":\s*\[\s*\{[^}]*?"id":\s*(\d+)/.exec(raw)![1];
const link = (region: string, user: string) => `${dev.edges[region]}/#token=${dev.demo.tokens[user]}`;

function percentiles(xs: number[]): { n: number; p50: number; p95: number; p99: number; max: number } {
  const s = [...xs].sort((a, b) => a - b);
  const at = (q: number) => s[Math.min(s.length - 1, Math.floor(q * s.length))];
  const r = (x: number) => Math.round(x * 10) / 10;
  return { n: s.length, p50: r(at(0.5)), p95: r(at(0.95)), p99: r(at(0.99)), max: r(s[s.length - 1]) };
}

/** ms from navigation start until the open conversation's rows are in the DOM. */
async function firstScreen(page: Page): Promise<number> {
  await page.waitForFunction(() => performance.getEntriesByName("first-screen").length > 0, { timeout: 30_000 });
  return page.evaluate(() => performance.getEntriesByName("first-screen")[0].startTime);
}

async function open(browser: Browser, url: string): Promise<Page> {
  const page = await (await browser.createBrowserContext()).newPage();
  await page.goto(url);
  await page.waitForSelector("body[data-ready='1']", { timeout: 30_000 });
  return page;
}

async function main(): Promise<void> {
  const browser = await puppeteer.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--enable-precise-memory-info"],
  });
  const results: Record<string, unknown> = { latency_ms: dev.latency_ms, conversation };

  // Cold: a fresh profile each time (nothing in IndexedDB), through the
  // ap-south edge for a user homed in eu-west.
  const cold: number[] = [];
  for (let i = 0; i < RUNS; i++) {
    const context = await browser.createBrowserContext();
    const page = await context.newPage();
    await page.goto(link("ap-south", "2"));
    cold.push(await firstScreen(page));
    await context.close();
  }
  results.first_screen_cold_ms = percentiles(cold);

  // Warm: reloads of one page.
  const bob = await open(browser, link("ap-south", "2"));
  const warm: number[] = [];
  for (let i = 0; i < RUNS; i++) {
    await bob.reload();
    warm.push(await firstScreen(bob));
  }
  results.first_screen_warm_ms = percentiles(warm);
  await bob.waitForSelector("body[data-ready='1']");

  // Send (user 1 through eu-west) -> rendered on user 2's page (ap-south),
  // both with the conversation open.
  const alice = await open(browser, link("eu-west", "1"));
  for (const page of [alice, bob]) {
    await page.click(`#conversations li[data-conv='${conversation}']`);
    await page.waitForFunction((c) => String((window as unknown as { cellmesh: { open(): bigint } }).cellmesh.open()) === c, {}, conversation);
  }
  await bob.evaluate(() => {
    const w = window as unknown as { seen: Map<string, number> };
    w.seen = new Map();
    new MutationObserver((records) => {
      for (const r of records)
        for (const n of r.addedNodes) {
          const text = (n as HTMLElement).textContent ?? "";
          const m = /bench-(\d+)/.exec(text);
          if (m && !w.seen.has(m[1])) w.seen.set(m[1], Date.now());
        }
    }).observe(document.getElementById("messages")!, { childList: true });
  });
  const sentAt = new Map<string, number>();
  for (let i = 0; i < SENDS; i++) {
    const id = String(i);
    sentAt.set(id, Date.now());
    await alice.evaluate((c, id) => {
      const w = window as unknown as { cellmesh: { client: { send(c: bigint, t: string): Promise<unknown> } }; failed?: string };
      w.cellmesh.client.send(BigInt(c), `bench-${id}`).catch((e: Error) => (w.failed = e.message));
    }, conversation, id);
    await new Promise((r) => setTimeout(r, 50));
  }
  await new Promise((r) => setTimeout(r, 3000));
  const seen = new Map<string, number>(await bob.evaluate(() => [...(window as unknown as { seen: Map<string, number> }).seen]));
  const rendered = [...sentAt].filter(([id]) => seen.has(id)).map(([id, at]) => seen.get(id)! - at);
  const failed = await alice.evaluate(() => (window as unknown as { failed?: string }).failed);
  if (failed) throw new Error(`a send failed: ${failed}`);
  results.send_to_rendered_ms = { ...percentiles(rendered), missing: SENDS - rendered.length };

  // Memory after MESSAGES messages arrive in the open conversation.
  const before = await bob.metrics();
  // At 90 a second: under the sender's rate limit (100/s, burst 200).
  for (let sent = 0; sent < MESSAGES; sent += 90) {
    const started = Date.now();
    await alice.evaluate(
      async (c, from, n) => {
        const w = window as unknown as { cellmesh: { client: { send(c: bigint, t: string): Promise<unknown> } } };
        await Promise.all(Array.from({ length: n }, (_, i) => w.cellmesh.client.send(BigInt(c), `load ${from + i}`)));
      },
      conversation,
      sent,
      Math.min(90, MESSAGES - sent),
    );
    await new Promise((r) => setTimeout(r, Math.max(0, 1000 - (Date.now() - started))));
  }
  await bob.waitForFunction((n) => {
    const w = window as unknown as { cellmesh: { list: { loaded: unknown[] } } };
    return w.cellmesh.list.loaded.length >= n;
  }, { timeout: 300_000 }, MESSAGES);
  await new Promise((r) => setTimeout(r, 2000));
  const after = await bob.metrics();
  const mb = (x: number | undefined) => Math.round(((x ?? 0) / (1 << 20)) * 10) / 10;
  results.memory_after_messages = {
    messages: MESSAGES,
    js_heap_used_mb_before: mb(before.JSHeapUsedSize),
    js_heap_used_mb_after: mb(after.JSHeapUsedSize),
    dom_nodes: after.Nodes,
    message_rows_in_dom: await bob.evaluate(() => document.querySelectorAll("#messages .msg").length),
  };
  await browser.close();
  console.log(JSON.stringify(results, null, 2));
  writeFileSync(out, JSON.stringify(results, null, 2) + "\n");
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
