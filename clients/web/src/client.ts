// The roaming client over gRPC-Web: sends go through an outbox and are
// re-sent with the same request id until answered (so a send survives a
// reload and is stored once); the sync loop resumes from the device's
// cursor, stores each event's message, fills any seq gap it sees with
// Pull, acks in batches, follows a Rebase, and reconnects with backoff and
// jitter; the first screen of a conversation comes from the local store.

import { Code, ConnectError, createClient, type Client, type Interceptor } from "@connectrpc/connect";
import { createGrpcWebTransport } from "@connectrpc/connect-web";
import { ErrorDetailSchema } from "./gen/cellmesh/v1/common_pb.js";
import {
  ConversationKind,
  Direction,
  Messaging,
  MessageType,
  type Conversation,
  type GetConversationResponse,
  type MarkReadResponse,
  type Message,
  type SearchResponse,
  type SendResponse,
} from "./gen/cellmesh/v1/messaging_pb.js";
import { Sync, SyncEventKind, type ConversationSummary, type UserPresence } from "./gen/cellmesh/v1/sync_pb.js";
import type { Store, StoredMessage } from "./store.js";

export interface ClientOptions {
  /** The edge's URL, e.g. `http://127.0.0.1:7509`. */
  edge: string;
  /** A cellmesh token or the tenant's OIDC token. */
  token: string;
  store: Store;
  /** Called after each batch of events is stored. */
  onChange?: (conversations: string[]) => void;
  /** Called with every message stored (from the stream, a backfill, a
   * page or an edit), so a view can merge exactly those. */
  onMessages?: (messages: StoredMessage[]) => void;
  /** Called when a member of a conversation is typing. */
  onTyping?: (conversation: string, user: string) => void;
  /** `stream` (Subscribe), `poll` (Ack + Pull every `pollMs`), or `auto`
   * (the default): stream, and poll instead when a proxy holds the
   * stream back (the queue moves on but nothing arrives). */
  transport?: "auto" | "stream" | "poll";
  pollMs?: number;
}

/** An error with the platform's stable reason (e.g. `NOT_A_MEMBER`). */
export class CellmeshError extends Error {
  constructor(
    message: string,
    readonly reason: string,
    readonly retryAfterMs: number,
    readonly grpcCode: Code,
  ) {
    super(message);
  }

  static from(e: unknown): CellmeshError {
    const err = ConnectError.from(e);
    const detail = err.findDetails(ErrorDetailSchema)[0];
    return new CellmeshError(
      err.rawMessage,
      detail?.reason ?? `GRPC_${Code[err.code]?.toUpperCase() ?? "UNKNOWN"}`,
      Number(detail?.retryAfterMs ?? 0n),
      err.code,
    );
  }

  /** Whether the same call may succeed later. `INTERNAL` is among them:
   * its outcome is unknown, and a re-send with the same request id is
   * answered once. */
  get retryable(): boolean {
    return [Code.Unavailable, Code.DeadlineExceeded, Code.Unknown, Code.ResourceExhausted, Code.Internal, Code.Aborted].includes(this.grpcCode);
  }
}

export function stored(m: Message): StoredMessage {
  return {
    msgId: m.msgId.toString(),
    conversation: m.conversationId.toString(),
    seq: Number(m.seq),
    sender: m.senderId.toString(),
    body: new TextDecoder().decode(m.body),
    serverTsMs: Number(m.serverTsMs),
    state: m.state,
    attachments: m.attachments.map((a) => ({ id: a.attachmentId.toString(), name: a.name, size: Number(a.size), contentType: a.contentType })),
  };
}

const ACK_EVERY_MS = 200;
/** No event for this long while the queue moves on: the stream is held. */
const STALL_MS = 3_000;
const PAGE = 50;

export class CellmeshClient {
  readonly messaging: Client<typeof Messaging>;
  readonly sync: Client<typeof Sync>;
  private abort: AbortController | undefined;
  private running: Promise<void> | undefined;
  private mode: "stream" | "poll";

  constructor(private options: ClientOptions) {
    this.mode = options.transport === "poll" ? "poll" : "stream";
    const auth: Interceptor = (next) => (req) => {
      req.header.set("authorization", `Bearer ${options.token}`);
      return next(req);
    };
    const transport = createGrpcWebTransport({ baseUrl: options.edge, interceptors: [auth] });
    this.messaging = createClient(Messaging, transport);
    this.sync = createClient(Sync, transport);
  }

  private get store(): Store {
    return this.options.store;
  }

  /** Stores `messages` and tells the app which. */
  private async put(messages: StoredMessage[]): Promise<void> {
    await this.store.putMessages(messages);
    if (messages.length > 0) this.options.onMessages?.(messages);
  }

  /** Sends `text`: into the outbox first, then to the edge. */
  async send(conversation: bigint, text: string): Promise<SendResponse> {
    const entry = {
      clientReqId: crypto.randomUUID(),
      conversation: conversation.toString(),
      body: text,
      createdAtMs: Date.now(),
    };
    await this.store.putOutbox(entry);
    return this.deliver(entry);
  }

  private async deliver(entry: { clientReqId: string; conversation: string; body: string }): Promise<SendResponse> {
    try {
      const r = await this.messaging.send({
        conversationId: BigInt(entry.conversation),
        clientReqId: entry.clientReqId,
        type: MessageType.TEXT,
        body: new TextEncoder().encode(entry.body),
      });
      await this.store.deleteOutbox(entry.clientReqId);
      return r;
    } catch (e) {
      const err = CellmeshError.from(e);
      // Refused for good: nothing to re-send.
      if (!err.retryable) await this.store.deleteOutbox(entry.clientReqId);
      throw err;
    }
  }

  /** Re-sends what the outbox holds (after a reload or a reconnect). */
  async flushOutbox(): Promise<SendResponse[]> {
    const out = [];
    for (const entry of await this.store.outbox()) out.push(await this.deliver(entry));
    return out;
  }

  /** The latest `n` messages of a conversation: from the store when it has
   * them, else from the edge (and stored). */
  async firstScreen(conversation: bigint, n = PAGE): Promise<StoredMessage[]> {
    const local = await this.store.page(conversation.toString(), Number.MAX_SAFE_INTEGER, n);
    if (local.length >= n) return local;
    return this.fetchPage(conversation, 0n, n);
  }

  /** The `n` messages before `beforeSeq`. */
  async pageBack(conversation: bigint, beforeSeq: number, n = PAGE): Promise<StoredMessage[]> {
    const local = await this.store.page(conversation.toString(), beforeSeq, n);
    if (local.length >= n || local[0]?.seq === 1) return local;
    return this.fetchPage(conversation, BigInt(beforeSeq), n);
  }

  private async fetchPage(conversation: bigint, before: bigint, n: number): Promise<StoredMessage[]> {
    const page = await wrap(this.messaging.pull({ conversationId: conversation, sinceSeq: before, direction: Direction.BACKWARD, limit: n }));
    const messages = page.messages.map(stored);
    await this.put(messages);
    return messages.sort((a, b) => a.seq - b.seq);
  }

  /** Brings `conversation` up to `latest`: what lies above the store's
   * highest seq, or the latest page when the store has none of it.
   * Whether anything was missing. */
  private async bringUp(conversation: bigint, latest: number): Promise<boolean> {
    const known = await this.store.maxSeq(conversation.toString());
    if (latest <= known) return false;
    if (known === 0) await this.fetchPage(conversation, 0n, PAGE);
    else await this.backfill(conversation, known, latest);
    return true;
  }

  /** The caller's conversations, most recently active first, with
   * unread counts and last messages. */
  async conversations(limit = 100): Promise<ConversationSummary[]> {
    return (await wrap(this.sync.listConversations({ limit }))).conversations;
  }

  /** A group of the caller and `members`; a retry with the same
   * `clientReqId` returns the group created first. */
  async createGroup(title: string, members: bigint[], clientReqId = crypto.randomUUID()): Promise<Conversation> {
    const r = await wrap(this.messaging.createConversation({ kind: ConversationKind.GROUP, title, memberIds: members, clientReqId }));
    if (!r.conversation) throw new CellmeshError("no conversation in the answer", "INTERNAL", 0, Code.Internal);
    return r.conversation;
  }

  /** A conversation and its members (the first 100). */
  async conversation(id: bigint): Promise<GetConversationResponse> {
    return wrap(this.messaging.getConversation({ conversationId: id }));
  }

  /** Marks `conversation` read through `seq` (never backwards). */
  async markRead(conversation: bigint, seq: number): Promise<MarkReadResponse> {
    return wrap(this.messaging.markRead({ conversationId: conversation, readSeq: BigInt(seq) }));
  }

  /**
   * Read receipts as counts: how many members have read each of `seqs` (1 to
   * 100), and how many members were counted.
   */
  async readCount(conversation: bigint, seqs: number[]): Promise<{ read: number[]; members: number }> {
    const r = await wrap(this.messaging.readCount({ conversationId: conversation, seqs: seqs.map(BigInt) }));
    return { read: r.read, members: r.memberCount };
  }

  /** Replaces the text of the caller's message `seq` (and the stored copy). */
  async edit(conversation: bigint, seq: number, text: string): Promise<StoredMessage> {
    const r = await wrap(this.messaging.edit({ conversationId: conversation, seq: BigInt(seq), body: new TextEncoder().encode(text) }));
    return this.keep(r.message);
  }

  /** Recalls the caller's message `seq` for everyone. */
  async recall(conversation: bigint, seq: number): Promise<StoredMessage> {
    return this.keep((await wrap(this.messaging.recall({ conversationId: conversation, seq: BigInt(seq) }))).message);
  }

  private async keep(m: Message | undefined): Promise<StoredMessage> {
    if (!m) throw new CellmeshError("no message in the answer", "INTERNAL", 0, Code.Internal);
    const s = stored(m);
    await this.put([s]);
    return s;
  }

  /** Tells the conversation's members the caller is typing. */
  async typing(conversation: bigint): Promise<void> {
    await wrap(this.sync.typing({ conversationId: conversation }));
  }

  /** Keeps the caller online; returns when to beat again (ms). */
  async heartbeat(): Promise<number> {
    return Number((await wrap(this.sync.heartbeat({}))).intervalMs);
  }

  /** Whether `users` are online, and when they were last seen. */
  async presence(users: bigint[]): Promise<UserPresence[]> {
    return (await wrap(this.sync.getPresence({ userIds: users }))).users;
  }

  /** Messages matching `query` in the caller's conversations (or one). */
  async search(query: string, conversation = 0n, cursor = ""): Promise<SearchResponse> {
    return wrap(this.messaging.search({ query, conversationId: conversation, cursor, pageSize: 20 }));
  }

  /** Fills `conversation` from seq `after` up to at least `through`. */
  private async backfill(conversation: bigint, after: number, through: number): Promise<void> {
    let since = BigInt(after);
    for (;;) {
      const page = await this.messaging.pull({ conversationId: conversation, sinceSeq: since, direction: Direction.FORWARD, limit: 100 });
      await this.put(page.messages.map(stored));
      if (!page.hasMore || Number(page.nextSeq) >= through) return;
      since = page.nextSeq;
    }
  }

  /** Starts the sync loop (until [`stop`]); after a stop still under
   * way, once it is done. */
  start(): void {
    if (this.abort && !this.abort.signal.aborted) return;
    const abort = new AbortController();
    this.abort = abort;
    const previous = this.running ?? Promise.resolve();
    this.running = previous.catch(() => {}).then(() => this.loop(abort.signal));
  }

  async stop(): Promise<void> {
    this.abort?.abort();
    await this.running?.catch(() => {});
  }

  /** How events arrive now: `stream`, or `poll` (set, or fallen back to). */
  get transport(): "stream" | "poll" {
    return this.mode;
  }

  private async loop(signal: AbortSignal): Promise<void> {
    let backoff = 100;
    while (!signal.aborted) {
      try {
        await this.flushOutbox().catch(() => {});
        await (this.mode === "poll" ? this.poll(signal) : this.stream(signal));
        backoff = 100;
      } catch (e) {
        if (signal.aborted) return;
        // Reconnect with backoff and jitter.
        const wait = backoff / 2 + Math.random() * backoff;
        backoff = Math.min(backoff * 2, 10_000);
        await sleep(wait, signal);
      }
    }
  }

  private async stream(signal: AbortSignal): Promise<void> {
    const at = await this.store.cursor();
    let pts = BigInt(at?.pts ?? "0");
    let queueId = BigInt(at?.queueId ?? "0");
    let acked = pts;
    let lastEvent = Date.now();
    let stalls = 0;
    const ack = async () => {
      if (pts === acked) return;
      const at = pts;
      await this.store.setCursor({ pts: at.toString(), queueId: queueId.toString() });
      acked = at;
      await this.sync.ack({ pts: at, queueId });
    };
    // A proxy that buffers the stream: the queue moves on, nothing
    // arrives. Twice in a row: poll instead.
    const inner = new AbortController();
    const stop = () => inner.abort();
    signal.addEventListener("abort", stop);
    const watch = async () => {
      if (this.options.transport !== "auto" && this.options.transport !== undefined) return;
      if (Date.now() - lastEvent < STALL_MS) return;
      const r = await this.sync.ack({ pts: acked, queueId });
      stalls = r.latestPts > pts && r.queueId === queueId ? stalls + 1 : 0;
      if (stalls >= 2) {
        this.mode = "poll";
        inner.abort();
      }
    };
    const timers = [
      setInterval(() => void ack().catch(() => {}), ACK_EVERY_MS),
      setInterval(() => void watch().catch(() => {}), STALL_MS),
    ];
    try {
      await this.consume(inner.signal, pts, queueId, (p, q) => {
        pts = p;
        queueId = q;
        lastEvent = Date.now();
        stalls = 0;
      });
    } catch (e) {
      if (!inner.signal.aborted || signal.aborted) throw e;
    } finally {
      timers.forEach(clearInterval);
      signal.removeEventListener("abort", stop);
      // What arrived is stored: so is its cursor, also when stopping (a
      // reload then resumes after it instead of replaying events).
      await ack().catch(() => {});
    }
  }

  /** Polling: Ack says how far the queue has gone; when it moved, the
   * conversations that grew are pulled from the seq the store has. */
  private async poll(signal: AbortSignal): Promise<void> {
    const at = await this.store.cursor();
    let pts = BigInt(at?.pts ?? "0");
    let queueId = BigInt(at?.queueId ?? "0");
    while (!signal.aborted) {
      const r = await this.sync.ack({ pts, queueId });
      if (r.latestPts !== pts || r.queueId !== queueId) {
        const changed = await this.catchUp();
        pts = r.latestPts;
        queueId = r.queueId;
        await this.store.setCursor({ pts: pts.toString(), queueId: queueId.toString() });
        await this.sync.ack({ pts, queueId });
        if (changed.length > 0) this.options.onChange?.(changed);
      }
      await sleep(this.options.pollMs ?? 1000, signal);
    }
  }

  /** Brings every conversation in the list up to its latest seq: a gap
   * is pulled, a conversation new to the store gets its latest page. */
  private async catchUp(): Promise<string[]> {
    const changed: string[] = [];
    const list = await this.sync.listConversations({ limit: 100 });
    for (const c of list.conversations) {
      const id = c.conversation?.conversationId;
      if (id === undefined) continue;
      if (await this.bringUp(id, Number(c.conversation?.latestSeq ?? 0n))) changed.push(id.toString());
    }
    return changed;
  }

  private async consume(
    signal: AbortSignal,
    fromPts: bigint,
    fromQueue: bigint,
    advance: (pts: bigint, queueId: bigint) => void,
  ): Promise<void> {
    let queueId = fromQueue;
    const pushes = this.sync.subscribe({ fromPts, queueId }, { signal });
    for await (const push of pushes) {
      const changed: string[] = [];
      switch (push.push.case) {
        case "event": {
          const e = push.push.value;
          const conversation = e.conversationId.toString();
          if (e.message) {
            const known = await this.store.maxSeq(conversation);
            // A seq beyond the next one: fetch what lies between.
            if (e.kind === SyncEventKind.MESSAGE && known > 0 && Number(e.seq) > known + 1) {
              await this.backfill(e.conversationId, known, Number(e.seq) - 1);
            }
            await this.put([stored(e.message)]);
          }
          changed.push(conversation);
          if (e.queueId !== 0n) queueId = e.queueId;
          advance(e.pts, queueId);
          break;
        }
        case "rebase": {
          // Too far behind to replay: the latest state instead.
          queueId = push.push.value.queueId;
          changed.push(...(await this.catchUp()));
          advance(push.push.value.latestPts, queueId);
          break;
        }
        case "hint": {
          // A large group (nothing queued per member): pull what is new.
          const h = push.push.value;
          if (await this.bringUp(h.conversationId, Number(h.latestSeq))) changed.push(h.conversationId.toString());
          break;
        }
        case "typing": {
          const t = push.push.value;
          this.options.onTyping?.(t.conversationId.toString(), t.userId.toString());
          break;
        }
        default:
          break;
      }
      if (changed.length > 0) this.options.onChange?.(changed);
    }
  }
}

/** Waits `ms`, or less when `signal` aborts. */
/** Awaits a call, its failure as a [`CellmeshError`]. */
async function wrap<T>(call: Promise<T>): Promise<T> {
  try {
    return await call;
  } catch (e) {
    throw CellmeshError.from(e);
  }
}

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const t = setTimeout(resolve, ms);
    signal?.addEventListener("abort", () => {
      clearTimeout(t);
      resolve();
    });
  });
}
