// The web chat app in headless Chromium (Debian's, driven by
// puppeteer-core) against live edges, started by the Rust test
// `web_app::the_web_app_works_in_a_real_browser`: two users on two edges;
// one page goes offline while the other sends 200 messages and shows all
// of them in order afterwards; a polling page shows a burst longer than a
// screen; a reload shows history from IndexedDB and
// resumes; a send made offline is delivered once; edit, recall and typing
// reach the other page; a tenant move and a failover during the session
// cost only a retry; CORS refuses an origin not on the list; OIDC sign-in,
// and every bad provider token refused with its reason.

import assert from "node:assert/strict";
import { createHmac, generateKeyPairSync, sign, type KeyObject } from "node:crypto";
import { existsSync, writeFileSync } from "node:fs";
import { after, before, test } from "node:test";
import puppeteer, { type Browser, type Page } from "puppeteer-core";

const env = (k: string) => process.env[k] ?? "";
const [edgeA, edgeB] = [env("CELLMESH_EDGE_A"), env("CELLMESH_EDGE_B")];
const conversation = env("CELLMESH_CONVERSATION");
const [tokenA, tokenB] = [env("CELLMESH_TOKEN_A"), env("CELLMESH_TOKEN_B")];

let browser: Browser;

before(async () => {
  browser = await puppeteer.launch({
    executablePath: env("CHROMIUM") || "/usr/bin/chromium",
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
  });
});

after(async () => {
  await browser?.close();
});

async function until(check: () => Promise<boolean>, what: string, ms = 20_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out: ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** A page of its own (own IndexedDB) signed in at `edge`. */
async function openApp(edge: string, fragment: string): Promise<Page> {
  const context = await browser.createBrowserContext();
  const page = await context.newPage();
  page.on("dialog", (d) => void d.accept(page.dialogAnswer ?? ""));
  await page.goto(`${edge}/#${fragment}`);
  await page.waitForSelector("body[data-ready='1']", { timeout: 20_000 });
  return page;
}

declare module "puppeteer-core" {
  interface Page {
    dialogAnswer?: string;
  }
}

interface Row {
  seq: number;
  body: string;
  msgId: string;
}

/** What the page's IndexedDB holds of the conversation. */
function storedRows(page: Page): Promise<Row[]> {
  return page.evaluate(async (c) => {
    const w = window as unknown as { cellmesh: { store: { page(c: string, b: number, n: number): Promise<Row[]> } } };
    const all = await w.cellmesh.store.page(c, Number.MAX_SAFE_INTEGER, 1_000_000);
    return all.map((m) => ({ seq: m.seq, body: m.body, msgId: m.msgId }));
  }, conversation);
}

/** The rows in the DOM, top to bottom. */
function renderedRows(page: Page): Promise<{ seq: number; text: string }[]> {
  return page.evaluate(() =>
    [...document.querySelectorAll<HTMLElement>("#messages .msg")]
      .sort((a, b) => parseFloat(a.style.top) - parseFloat(b.style.top))
      .map((el) => ({ seq: Number(el.dataset.seq), text: el.textContent ?? "" })),
  );
}

/** Sends `bodies` one by one as the app does: a retryable failure stays
 * in the outbox and is re-sent (same request id) until answered. */
function sendFrom(page: Page, bodies: string[]): Promise<void> {
  return page.evaluate(
    async (c, bodies) => {
      type Client = { send(c: bigint, t: string): Promise<unknown>; flushOutbox(): Promise<unknown> };
      const w = window as unknown as { cellmesh: { client: Client } };
      for (const b of bodies) {
        let sent = w.cellmesh.client.send(BigInt(c), b);
        for (let attempt = 0; ; attempt++) {
          try {
            await sent;
            break;
          } catch (e) {
            if (!(e as { retryable: boolean }).retryable || attempt > 100) throw e;
            await new Promise((r) => setTimeout(r, 200));
            sent = w.cellmesh.client.flushOutbox();
          }
        }
      }
    },
    conversation,
    bodies,
  );
}

function assertInOrder(rows: Row[], what: string): void {
  for (let i = 1; i < rows.length; i++) assert.ok(rows[i].seq > rows[i - 1].seq, `${what}: in seq order`);
  assert.equal(new Set(rows.map((r) => r.msgId)).size, rows.length, `${what}: no duplicate`);
}

let alice: Page;
let bob: Page;

test("two users on two edges: one offline while the other sends 200, then all 200 in order", async () => {
  alice = await openApp(edgeA, `token=${tokenA}`);
  bob = await openApp(edgeB, `token=${tokenB}`);
  await bob.setOfflineMode(true);
  const before = (await storedRows(bob)).length;
  const bodies = Array.from({ length: 200 }, (_, i) => `burst ${i}`);
  await sendFrom(alice, bodies);
  await new Promise((r) => setTimeout(r, 500));
  assert.equal((await storedRows(bob)).length, before, "nothing reaches an offline page");

  await bob.setOfflineMode(false);
  await until(async () => (await storedRows(bob)).filter((r) => r.body.startsWith("burst ")).length === 200, "bob has all 200");
  const rows = await storedRows(bob);
  assertInOrder(rows, "bob's store");
  assert.deepEqual(rows.filter((r) => r.body.startsWith("burst ")).map((r) => r.body), bodies);
  // The view shows the newest and keeps the DOM small (virtualised).
  await until(async () => (await renderedRows(bob)).at(-1)?.text.includes("burst 199") ?? false, "bob renders the last");
  const rendered = await renderedRows(bob);
  assert.ok(rendered.length <= 60, `${rendered.length} rows in the DOM`);
  for (let i = 1; i < rendered.length; i++) assert.ok(rendered[i].seq > rendered[i - 1].seq);
});

test("a page that polls shows a burst longer than a screen without a hole", async () => {
  const polling = await openApp(edgeB, `token=${tokenB}&transport=poll`);
  // All at once, between two polls.
  const bodies = Array.from({ length: 120 }, (_, i) => `polled burst ${i}`);
  await alice.evaluate(
    async (c, bodies) => {
      const w = window as unknown as { cellmesh: { client: { send(c: bigint, t: string): Promise<unknown> } } };
      await Promise.all(bodies.map((b) => w.cellmesh.client.send(BigInt(c), b)));
    },
    conversation,
    bodies,
  );
  const shown = () =>
    polling.evaluate(() =>
      (window as unknown as { cellmesh: { list: { loaded: Row[] } } }).cellmesh.list.loaded.map((m) => m.body).filter((b) => b.startsWith("polled burst ")),
    );
  await until(async () => (await storedRows(polling)).filter((r) => r.body.startsWith("polled burst ")).length === 120, "stored");
  await until(async () => (await shown()).length === 120, "the polling page's view has all 120");
  assert.deepEqual([...(await shown())].sort(), [...bodies].sort());
  assert.equal(await polling.evaluate(() => (window as unknown as { cellmesh: { client: { transport: string } } }).cellmesh.client.transport), "poll");
  await polling.browserContext().close();
});

test("a reload shows history from IndexedDB at once and resumes from its cursor", async () => {
  await until(async () => (await storedRows(bob)).filter((r) => r.body.startsWith("polled burst ")).length === 120, "bob has the burst");
  await bob.reload();
  await bob.waitForSelector("#messages .msg", { timeout: 5_000 });
  const last = (await storedRows(bob)).at(-1)!;
  assert.equal((await renderedRows(bob)).at(-1)?.seq, last.seq, "the newest stored is shown");
  const held = (await storedRows(bob)).length;
  await sendFrom(alice, ["after the reload"]);
  await until(async () => (await renderedRows(bob)).some((r) => r.text.includes("after the reload")), "bob renders the new one");
  const rows = await storedRows(bob);
  assert.equal(rows.length, held + 1, "only what is new arrived");
  assertInOrder(rows, "after the reload");
});

test("a send made offline is delivered exactly once after reconnecting", async () => {
  await bob.setOfflineMode(true);
  await bob.type("#text", "written offline");
  await bob.keyboard.press("Enter");
  await until(
    () => bob.evaluate(async () => (await (window as unknown as { cellmesh: { store: { outbox(): Promise<unknown[]> } } }).cellmesh.store.outbox()).length === 1),
    "kept in the outbox",
  );
  await new Promise((r) => setTimeout(r, 500));
  await bob.setOfflineMode(false);
  await until(async () => (await storedRows(alice)).some((r) => r.body === "written offline"), "alice has it");
  await new Promise((r) => setTimeout(r, 1000));
  assert.equal((await storedRows(alice)).filter((r) => r.body === "written offline").length, 1);
  await until(
    () => bob.evaluate(async () => (await (window as unknown as { cellmesh: { store: { outbox(): Promise<unknown[]> } } }).cellmesh.store.outbox()).length === 0),
    "the outbox is empty",
  );
});

test("typing, an edit and a recall reach the other page", async () => {
  await sendFrom(alice, ["to be edited"]);
  await until(async () => (await renderedRows(bob)).some((r) => r.text.includes("to be edited")), "bob has it");
  await alice.type("#text", "hel");
  await until(async () => (await bob.$eval("#typing", (e) => e.textContent ?? "")).includes("typing"), "bob sees typing");

  const lastOf = async (page: Page, text: string) => {
    await until(async () => (await renderedRows(page)).some((r) => r.text.includes(text)), `${text} rendered`);
    const seq = (await renderedRows(page)).filter((r) => r.text.includes(text)).at(-1)!.seq;
    return `#messages .msg[data-seq='${seq}']`;
  };
  alice.dialogAnswer = "edited text";
  await (await alice.$(`${await lastOf(alice, "to be edited")} button.edit`))!.click();
  await until(async () => (await renderedRows(bob)).some((r) => r.text.includes("edited text") && r.text.includes("edited")), "bob sees the edit");
  await (await alice.$(`${await lastOf(alice, "edited text")} button.recall`))!.click();
  await until(async () => (await renderedRows(bob)).some((r) => r.text.includes("message recalled")), "bob sees the recall");
  assert.ok(!(await renderedRows(bob)).some((r) => r.text.includes("edited text")));
});

/** Asks the Rust side for `operation` (a file in the control directory),
 * sends `n` messages meanwhile, waits for `done`, then checks bob has them
 * all, in order and once, and the one sent after it. */
async function sendDuring(operation: string, done: string, prefix: string, n: number): Promise<void> {
  const control = env("CELLMESH_CONTROL");
  writeFileSync(`${control}/${operation}`, "");
  const sending = sendFrom(alice, Array.from({ length: n }, (_, i) => `${prefix} ${i}`));
  await until(async () => existsSync(`${control}/${done}`), `${operation} ends`, 60_000);
  await sending;
  const last = `after ${operation}`;
  await sendFrom(alice, [last]);
  await until(async () => (await storedRows(bob)).some((r) => r.body === last), "bob has it", 30_000);
  const rows = await storedRows(bob);
  assertInOrder(rows, `across ${operation}`);
  assert.equal(rows.filter((r) => r.body.startsWith(`${prefix} `)).length, n);
  await until(async () => (await renderedRows(bob)).some((r) => r.text.includes(last)), "bob renders it");
}

test("a tenant move during the session costs at most a retry", async () => {
  await sendDuring("move", "moved", "moving", 40);
  assert.ok(!(await alice.$eval("#error", (e) => (e as HTMLElement).hidden ? "" : e.textContent ?? "")), "no error shown");
});

test("a failover of the tenant's cell during the session costs at most a retry", async () => {
  await sendDuring("fail-over", "failed-over", "failing over", 20);
});

test("CORS: a page may call only the edges that list its origin", async () => {
  // Edge A lists edge B's origin; edge B lists nothing.
  const call = (page: Page, edge: string, token: string) =>
    page.evaluate(
      async (edge, token) => {
        const w = window as unknown as { cellmesh: { client: object; store: object } };
        const Client = w.cellmesh.client.constructor as new (o: object) => { conversations(): Promise<unknown[]> };
        try {
          return `ok ${(await new Client({ edge, token, store: w.cellmesh.store }).conversations()).length}`;
        } catch (e) {
          return `refused ${(e as { reason?: string }).reason}`;
        }
      },
      edge,
      token,
    );
  assert.match(await call(bob, edgeA, tokenB), /^ok [1-9]/);
  assert.match(await call(alice, edgeB, tokenA), /^refused/);
});

function b64url(data: string | Buffer): string {
  return Buffer.from(data).toString("base64url");
}

function jwt(header: object, claims: object, key: KeyObject | null, hmacSecret?: string): string {
  const input = `${b64url(JSON.stringify(header))}.${b64url(JSON.stringify(claims))}`;
  if (hmacSecret !== undefined) return `${input}.${createHmac("sha256", hmacSecret).update(input).digest("base64url")}`;
  if (!key) return `${input}.`;
  return `${input}.${sign("sha256", Buffer.from(input), { key, dsaEncoding: "ieee-p1363" }).toString("base64url")}`;
}

test("sign-in with the tenant's identity provider; every bad token refused with its reason", async () => {
  const { publicKey, privateKey } = generateKeyPairSync("ec", { namedCurve: "P-256" });
  writeFileSync(env("CELLMESH_JWKS_PATH"), JSON.stringify({ keys: [{ ...publicKey.export({ format: "jwk" }), kid: "test-1", alg: "ES256", use: "sig" }] }));
  const now = Math.floor(Date.now() / 1000);
  const claims = { iss: env("CELLMESH_ISSUER"), aud: "cellmesh", sub: env("CELLMESH_OIDC_USER"), iat: now, exp: now + 600 };
  const good = jwt({ alg: "ES256", kid: "test-1", typ: "JWT" }, claims, privateKey);
  const carol = await openApp(edgeA, `token=${good}&tenant=1&user=${claims.sub}`);
  assert.ok(await carol.$(`#conversations li[data-conv='${conversation}']`), "carol sees the conversation");

  const pem = publicKey.export({ format: "pem", type: "spki" }).toString();
  const bad: [string, string][] = [
    [jwt({ alg: "ES256", kid: "test-1" }, { ...claims, iss: "https://evil.test" }, privateKey), "TOKEN_WRONG_ISSUER"],
    [jwt({ alg: "ES256", kid: "test-1" }, { ...claims, aud: "other" }, privateKey), "TOKEN_WRONG_AUDIENCE"],
    [jwt({ alg: "ES256", kid: "test-1" }, { ...claims, exp: now - 3600 }, privateKey), "TOKEN_EXPIRED"],
    [jwt({ alg: "ES256", kid: "unknown" }, claims, privateKey), "TOKEN_UNKNOWN_KEY"],
    [jwt({ alg: "none", kid: "test-1" }, claims, null), "TOKEN_ALGORITHM_REFUSED"],
    [jwt({ alg: "HS256", kid: "test-1" }, claims, null, pem), "TOKEN_ALGORITHM_REFUSED"],
  ];
  for (const [token, reason] of bad) {
    const got = await carol.evaluate(async (token) => {
      const w = window as unknown as { cellmesh: { client: object; store: object } };
      const Client = w.cellmesh.client.constructor as new (o: object) => { conversations(): Promise<unknown[]> };
      return new Client({ edge: location.origin, token, store: w.cellmesh.store }).conversations().then(
        () => "accepted",
        (e: { reason: string }) => e.reason,
      );
    }, token);
    assert.equal(got, reason);
  }
});
