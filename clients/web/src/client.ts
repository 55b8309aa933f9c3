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
  Direction,
  Messaging,
  MessageType,
  type Message,
  type SendResponse,
} from "./gen/cellmesh/v1/messaging_pb.js";
import { Sync, SyncEventKind } from "./gen/cellmesh/v1/sync_pb.js";
import type { Store, StoredMessage } from "./store.js";

export interface ClientOptions {
  /** The edge's URL, e.g. `http://127.0.0.1:7509`. */
  edge: string;
  /** A cellmesh token or the tenant's OIDC token. */
  token: string;
  store: Store;
  /** Called after each batch of events is stored. */
  onChange?: (conversations: string[]) => void;
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

  /** Whether the same call may succeed later. */
  get retryable(): boolean {
    return [Code.Unavailable, Code.DeadlineExceeded, Code.Unknown, Code.ResourceExhausted].includes(this.grpcCode);
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
  };
}

const ACK_EVERY_MS = 200;
const PAGE = 50;

export class CellmeshClient {
  readonly messaging: Client<typeof Messaging>;
  readonly sync: Client<typeof Sync>;
  private abort: AbortController | undefined;
  private running: Promise<void> | undefined;

  constructor(private options: ClientOptions) {
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
    try {
      const page = await this.messaging.pull({
        conversationId: conversation,
        sinceSeq: before,
        direction: Direction.BACKWARD,
        limit: n,
      });
      const messages = page.messages.map(stored);
      await this.store.putMessages(messages);
      return messages.sort((a, b) => a.seq - b.seq);
    } catch (e) {
      throw CellmeshError.from(e);
    }
  }

  /** Fills `conversation` from seq `after` up to at least `through`. */
  private async backfill(conversation: bigint, after: number, through: number): Promise<void> {
    let since = BigInt(after);
    for (;;) {
      const page = await this.messaging.pull({ conversationId: conversation, sinceSeq: since, direction: Direction.FORWARD, limit: 100 });
      await this.store.putMessages(page.messages.map(stored));
      if (!page.hasMore || Number(page.nextSeq) >= through) return;
      since = page.nextSeq;
    }
  }

  /** Starts the sync loop (until [`stop`]). */
  start(): void {
    if (this.running) return;
    this.abort = new AbortController();
    this.running = this.loop(this.abort.signal);
  }

  async stop(): Promise<void> {
    this.abort?.abort();
    await this.running?.catch(() => {});
    this.running = undefined;
  }

  private async loop(signal: AbortSignal): Promise<void> {
    let backoff = 100;
    while (!signal.aborted) {
      try {
        await this.flushOutbox().catch(() => {});
        await this.stream(signal);
        backoff = 100;
      } catch (e) {
        if (signal.aborted) return;
        // Reconnect with backoff and jitter.
        const wait = backoff / 2 + Math.random() * backoff;
        backoff = Math.min(backoff * 2, 10_000);
        await new Promise((r) => setTimeout(r, wait));
      }
    }
  }

  private async stream(signal: AbortSignal): Promise<void> {
    const at = await this.store.cursor();
    let pts = BigInt(at?.pts ?? "0");
    let queueId = BigInt(at?.queueId ?? "0");
    let acked = pts;
    const ack = async () => {
      if (pts === acked) return;
      const at = pts;
      await this.store.setCursor({ pts: at.toString(), queueId: queueId.toString() });
      acked = at;
      await this.sync.ack({ pts: at, queueId });
    };
    // Acks in batches: at most every ACK_EVERY_MS, and when the stream ends.
    const timer = setInterval(() => void ack().catch(() => {}), ACK_EVERY_MS);
    try {
      await this.consume(signal, pts, queueId, (p, q) => {
        pts = p;
        queueId = q;
      });
    } finally {
      clearInterval(timer);
    }
    await ack();
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
            await this.store.putMessages([stored(e.message)]);
            changed.push(conversation);
          }
          if (e.queueId !== 0n) queueId = e.queueId;
          advance(e.pts, queueId);
          break;
        }
        case "rebase": {
          // Too far behind to replay: the latest state instead.
          queueId = push.push.value.queueId;
          const list = await this.sync.listConversations({ limit: 100 });
          for (const c of list.conversations) {
            const id = c.conversation?.conversationId;
            if (id !== undefined) await this.fetchPage(id, 0n, PAGE);
          }
          advance(push.push.value.latestPts, queueId);
          break;
        }
        default:
          break;
      }
      if (changed.length > 0) this.options.onChange?.(changed);
    }
  }
}
