// The web chat app: sign-in with a token (from the link `cellmesh dev`
// prints, or pasted), the conversation list with unread counts and last
// messages, a virtualised conversation view with live messages, typing,
// presence, read marks, edit and recall, new groups and search. Built on
// the SDK; the page's store is IndexedDB, so a reload shows history at
// once and resumes from its cursor. `window.cellmesh` exposes the client
// and store to scripts (tests, the browser benchmark).

import { CellmeshClient, CellmeshError } from "../src/client.js";
import { IndexedDbStore, type StoredMessage } from "../src/store.js";
import { ConversationKind, MessageState } from "../src/gen/cellmesh/v1/messaging_pb.js";
import { MessageList } from "./list.js";

const $ = <T extends HTMLElement>(id: string) => document.getElementById(id) as T;
const SESSION = "cellmesh.session";

interface Session {
  token: string;
  edge: string;
  tenant: string;
  user: string;
  /** `poll` where a proxy holds streams back (`&transport=poll`). */
  transport?: "auto" | "stream" | "poll";
}

/** The tenant and user a cellmesh token (`cm1.<claims>.<sig>`) or a JWT
 * names; the `user` of the link wins for a provider's token. */
function claims(token: string): { tenant: string; user: string } {
  try {
    const part = token.split(".")[1];
    const json = JSON.parse(atob(part.replace(/-/g, "+").replace(/_/g, "/")));
    return { tenant: String(json.tenant ?? json.tid ?? "0"), user: String(json.user ?? json.sub ?? "0") };
  } catch {
    return { tenant: "0", user: "0" };
  }
}

function session(): Session | undefined {
  const hash = new URLSearchParams(location.hash.slice(1));
  const token = hash.get("token");
  if (token) {
    const c = claims(token);
    const transport = (hash.get("transport") ?? "auto") as Session["transport"];
    const s = { token, edge: hash.get("edge") || location.origin, tenant: hash.get("tenant") ?? c.tenant, user: hash.get("user") ?? c.user, transport };
    localStorage.setItem(SESSION, JSON.stringify(s));
    history.replaceState(null, "", location.pathname);
    return s;
  }
  const saved = localStorage.getItem(SESSION);
  return saved ? (JSON.parse(saved) as Session) : undefined;
}

function showError(e: unknown): void {
  const err = e instanceof CellmeshError ? e : CellmeshError.from(e);
  const retry = err.retryAfterMs > 0 ? ` (retry in ${Math.ceil(err.retryAfterMs / 1000)} s)` : "";
  const box = $("error");
  box.textContent = `${err.reason}: ${err.message}${retry}`;
  box.dataset.reason = err.reason;
  box.hidden = false;
  setTimeout(() => (box.hidden = true), 6000);
}

function signIn(): void {
  const form = $<HTMLFormElement>("signin");
  form.hidden = false;
  form.onsubmit = (ev) => {
    ev.preventDefault();
    const token = $<HTMLTextAreaElement>("token").value.trim();
    const edge = $<HTMLInputElement>("edge").value.trim() || location.origin;
    location.hash = new URLSearchParams({ token, edge }).toString();
    location.reload();
  };
}

async function main(): Promise<void> {
  const saved = session();
  if (!saved) return signIn();
  const s: Session = saved;
  const store = await IndexedDbStore.open(`cellmesh-${s.tenant}-${s.user}`);
  let open: bigint | undefined;
  const typers = new Map<string, number>();
  const client: CellmeshClient = new CellmeshClient({
    edge: s.edge,
    token: s.token,
    store,
    transport: s.transport,
    onChange: () => scheduleRefresh(),
    onMessages: (messages) => {
      const here = messages.filter((m) => m.conversation === open?.toString());
      if (here.length === 0) return;
      list.merge(here);
      markSeen();
    },
    onTyping: (conversation, user) => {
      if (conversation !== open?.toString() || user === s.user) return;
      typers.set(user, Date.now() + 4000);
      paintTyping();
    },
  });
  const list = new MessageList($("messages"), $("spacer"), row, (before) => client.pageBack(open!, before).catch(fail));
  (window as unknown as Record<string, unknown>).cellmesh = { client, store, list, session: s, open: () => open };
  $("chat").hidden = false;
  $("me").textContent = `user ${s.user}`;

  function fail(e: unknown): StoredMessage[] {
    showError(e);
    return [];
  }

  function row(m: StoredMessage): HTMLElement {
    const el = document.createElement("div");
    const mine = m.sender === s.user;
    el.className = `msg${mine ? " mine" : ""}${m.state === MessageState.RECALLED ? " recalled" : ""}`;
    el.dataset.seq = String(m.seq);
    const who = document.createElement("div");
    who.className = "who";
    who.textContent = `${mine ? "you" : `user ${m.sender}`} · ${new Date(m.serverTsMs).toLocaleTimeString()}`;
    const body = document.createElement("div");
    const text = document.createElement("span");
    text.className = "body";
    const files = (m.attachments ?? []).map((a) => `📎 ${a.name} (${a.size} B)`).join(" ");
    text.textContent = m.state === MessageState.RECALLED ? "message recalled" : [m.body, files].filter(Boolean).join(" ");
    body.append(text);
    if (m.state === MessageState.EDITED) body.append(Object.assign(document.createElement("span"), { className: "state", textContent: "edited" }));
    if (mine && m.state !== MessageState.RECALLED) {
      const edit = Object.assign(document.createElement("button"), { textContent: "edit", className: "edit" });
      edit.onclick = () => {
        const next = prompt("Edit message", m.body);
        if (next !== null) client.edit(open!, m.seq, next).then((u) => list.merge([u]), fail);
      };
      const recall = Object.assign(document.createElement("button"), { textContent: "recall", className: "recall" });
      recall.onclick = () => void client.recall(open!, m.seq).then((u) => list.merge([u]), fail);
      body.append(edit, recall);
    }
    el.append(who, body);
    return el;
  }

  function paintTyping(): void {
    const now = Date.now();
    const who = [...typers].filter(([, until]) => until > now).map(([u]) => `user ${u}`);
    $("typing").textContent = who.length ? `${who.join(", ")} typing…` : "";
  }
  setInterval(paintTyping, 1000);

  async function refreshList(): Promise<void> {
    const items = await client.conversations();
    const ul = $("conversations");
    ul.replaceChildren(
      ...items.map((c) => {
        const id = c.conversation?.conversationId ?? 0n;
        const li = document.createElement("li");
        li.dataset.conv = id.toString();
        if (id === open) li.className = "open";
        const title = c.conversation?.title || (c.conversation?.kind === ConversationKind.DIRECT ? "Direct" : `Group ${id}`);
        const unread = id === open ? 0n : c.unread;
        const last = c.lastMessage ? new TextDecoder().decode(c.lastMessage.body) : "";
        li.innerHTML = `<span class="badge"${unread ? "" : " hidden"}></span><strong></strong><div class="last"></div>`;
        li.querySelector(".badge")!.textContent = unread.toString();
        li.querySelector("strong")!.textContent = title;
        li.querySelector(".last")!.textContent = last;
        li.onclick = () => void select(id).catch(showError);
        return li;
      }),
    );
  }

  let timer: ReturnType<typeof setTimeout> | undefined;
  function scheduleRefresh(): void {
    // The list at most every 250 ms (the open conversation's rows come
    // through onMessages).
    timer ??= setTimeout(() => {
      timer = undefined;
      void refreshList().catch(() => {});
    }, 250);
  }

  // Read marks at most every 500 ms, for the newest row shown.
  let reading: ReturnType<typeof setTimeout> | undefined;
  function markSeen(): void {
    reading ??= setTimeout(() => {
      reading = undefined;
      const top = list.loaded[list.loaded.length - 1];
      if (open !== undefined && top && document.visibilityState === "visible") void client.markRead(open, top.seq).catch(() => {});
    }, 500);
  }

  const lastOpen = `cellmesh.open.${s.tenant}.${s.user}`;
  async function select(id: bigint): Promise<void> {
    open = id;
    localStorage.setItem(lastOpen, id.toString());
    typers.clear();
    list.reset(await client.firstScreen(id));
    if (performance.getEntriesByName("first-screen").length === 0) performance.mark("first-screen");
    for (const el of document.querySelectorAll<HTMLElement>("#conversations li")) el.classList.toggle("open", el.dataset.conv === id.toString());
    $<HTMLInputElement>("text").disabled = false;
    document.querySelector<HTMLButtonElement>("#composer button")!.disabled = false;
    const info = await client.conversation(id);
    $("title").textContent = info.conversation?.title || `Conversation ${id}`;
    void showPresence(info.memberIds.filter((u) => u.toString() !== s.user));
    const seq = list.loaded[list.loaded.length - 1]?.seq;
    if (seq) await client.markRead(id, seq).then(() => refreshList(), () => {});
  }

  async function showPresence(others: bigint[]): Promise<void> {
    if (others.length === 0) return;
    const users = await client.presence(others.slice(0, 20)).catch(() => []);
    const online = users.filter((u) => u.online).length;
    $("presence").textContent = `${online} of ${users.length} online`;
  }

  let lastTyping = 0;
  $<HTMLInputElement>("text").oninput = () => {
    if (open === undefined || Date.now() - lastTyping < 3000) return;
    lastTyping = Date.now();
    void client.typing(open).catch(() => {});
  };
  $<HTMLFormElement>("composer").onsubmit = (ev) => {
    ev.preventDefault();
    const input = $<HTMLInputElement>("text");
    const text = input.value.trim();
    if (!text || open === undefined) return;
    input.value = "";
    const conv = open;
    client.send(conv, text).then(
      () => {},
      (e: unknown) => {
        // A retryable failure stays in the outbox: it goes out on reconnect.
        if (!(e as CellmeshError).retryable) showError(e);
      },
    );
  };
  $("new-group").onclick = () => {
    const title = prompt("Group title");
    if (!title) return;
    const members = (prompt("Member user ids, comma-separated") ?? "").split(",").map((x) => x.trim()).filter(Boolean);
    client.createGroup(title, members.map(BigInt)).then(async (c) => {
      await refreshList();
      await select(c.conversationId);
    }, showError);
  };
  $("signout").onclick = () => {
    localStorage.removeItem(SESSION);
    location.reload();
  };
  $<HTMLInputElement>("search").onchange = () => void search().catch(showError);

  async function search(): Promise<void> {
    const q = $<HTMLInputElement>("search").value.trim();
    const ul = $("results");
    ul.hidden = !q;
    if (!q) return;
    const r = await client.search(q);
    ul.replaceChildren(
      ...r.hits.map((h) => {
        const li = document.createElement("li");
        li.innerHTML = `<div class="snippet"></div>`;
        li.querySelector(".snippet")!.textContent = h.snippet;
        li.onclick = () => void select(h.message!.conversationId).catch(showError);
        return li;
      }),
    );
    if (r.partial) ul.append(Object.assign(document.createElement("li"), { textContent: "Some conversations could not be searched." }));
  }

  client.start();
  // The network went away: stop streaming (and re-send the outbox, then
  // resume from the cursor, when it is back).
  window.addEventListener("offline", () => void client.stop());
  window.addEventListener("online", () => client.start());
  const beat = async () => setTimeout(beat, await client.heartbeat().catch(() => 30_000));
  void beat();
  // The conversation open last time, from IndexedDB before any answer
  // from the edge; else the first of the list.
  const listed = refreshList().catch(showError);
  const last = localStorage.getItem(lastOpen);
  if (last) await select(BigInt(last)).catch(() => localStorage.removeItem(lastOpen));
  await listed;
  const first = document.querySelector<HTMLElement>("#conversations li");
  if (open === undefined && first) await select(BigInt(first.dataset.conv!)).catch(showError);
  document.body.dataset.ready = "1";
}

main().catch(showError);
