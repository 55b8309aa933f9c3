// The client's local store: messages keyed by msg_id with a
// (conversation, seq) index, the device's sync cursor, and the outbox of
// sends not yet acknowledged. One interface, two implementations: in
// memory, and IndexedDB (what survives a page reload).

/** A message as the store keeps it (ids as decimal strings). */
export interface StoredMessage {
  msgId: string;
  conversation: string;
  seq: number;
  sender: string;
  body: string;
  serverTsMs: number;
  state: number;
  /** Files the message carries (gone once recalled). */
  attachments?: { id: string; name: string; size: number; contentType: string }[];
}

/** Where the device's sync queue stands. */
export interface Cursor {
  pts: string;
  queueId: string;
}

/** A send waiting for its answer; re-sent with the same request id. */
export interface OutboxEntry {
  clientReqId: string;
  conversation: string;
  body: string;
  createdAtMs: number;
}

export interface Store {
  /** Inserts or replaces by msg_id (an edit or recall replaces). */
  putMessages(messages: StoredMessage[]): Promise<void>;
  /** Up to `n` messages of `conversation` below `beforeSeq`, oldest first. */
  page(conversation: string, beforeSeq: number, n: number): Promise<StoredMessage[]>;
  /** The highest seq stored for `conversation` (0: none). */
  maxSeq(conversation: string): Promise<number>;
  cursor(): Promise<Cursor | undefined>;
  setCursor(cursor: Cursor): Promise<void>;
  outbox(): Promise<OutboxEntry[]>;
  putOutbox(entry: OutboxEntry): Promise<void>;
  deleteOutbox(clientReqId: string): Promise<void>;
}

export class MemoryStore implements Store {
  private messages = new Map<string, StoredMessage>();
  private at: Cursor | undefined;
  private pending = new Map<string, OutboxEntry>();

  async putMessages(messages: StoredMessage[]): Promise<void> {
    for (const m of messages) this.messages.set(m.msgId, m);
  }
  async page(conversation: string, beforeSeq: number, n: number): Promise<StoredMessage[]> {
    const all = [...this.messages.values()]
      .filter((m) => m.conversation === conversation && m.seq < beforeSeq)
      .sort((a, b) => a.seq - b.seq);
    return all.slice(Math.max(0, all.length - n));
  }
  async maxSeq(conversation: string): Promise<number> {
    let max = 0;
    for (const m of this.messages.values()) if (m.conversation === conversation) max = Math.max(max, m.seq);
    return max;
  }
  async cursor(): Promise<Cursor | undefined> {
    return this.at;
  }
  async setCursor(cursor: Cursor): Promise<void> {
    this.at = cursor;
  }
  async outbox(): Promise<OutboxEntry[]> {
    return [...this.pending.values()].sort((a, b) => a.createdAtMs - b.createdAtMs);
  }
  async putOutbox(entry: OutboxEntry): Promise<void> {
    this.pending.set(entry.clientReqId, entry);
  }
  async deleteOutbox(clientReqId: string): Promise<void> {
    this.pending.delete(clientReqId);
  }
}

function done<T>(request: IDBRequest<T>): Promise<T> {
  return new Promise((resolve, reject) => {
    request.onsuccess = () => resolve(request.result);
    request.onerror = () => reject(request.error);
  });
}

/** The store in IndexedDB database `name` (one per user and device). */
export class IndexedDbStore implements Store {
  private constructor(private db: IDBDatabase) {}

  static async open(name: string, factory: IDBFactory = indexedDB): Promise<IndexedDbStore> {
    const request = factory.open(name, 1);
    request.onupgradeneeded = () => {
      const db = request.result;
      const messages = db.createObjectStore("messages", { keyPath: "msgId" });
      messages.createIndex("bySeq", ["conversation", "seq"], { unique: false });
      db.createObjectStore("meta");
      db.createObjectStore("outbox", { keyPath: "clientReqId" });
    };
    return new IndexedDbStore(await done(request));
  }

  close(): void {
    this.db.close();
  }

  private tx(name: string, mode: IDBTransactionMode): IDBObjectStore {
    return this.db.transaction(name, mode).objectStore(name);
  }

  async putMessages(messages: StoredMessage[]): Promise<void> {
    if (messages.length === 0) return;
    const t = this.db.transaction("messages", "readwrite");
    const store = t.objectStore("messages");
    for (const m of messages) store.put(m);
    await new Promise<void>((resolve, reject) => {
      t.oncomplete = () => resolve();
      t.onerror = () => reject(t.error);
    });
  }

  async page(conversation: string, beforeSeq: number, n: number): Promise<StoredMessage[]> {
    const index = this.tx("messages", "readonly").index("bySeq");
    const range = IDBKeyRange.bound([conversation, 0], [conversation, beforeSeq], false, true);
    const out: StoredMessage[] = [];
    await new Promise<void>((resolve, reject) => {
      const request = index.openCursor(range, "prev");
      request.onerror = () => reject(request.error);
      request.onsuccess = () => {
        const c = request.result;
        if (!c || out.length >= n) return resolve();
        out.push(c.value as StoredMessage);
        c.continue();
      };
    });
    return out.reverse();
  }

  async maxSeq(conversation: string): Promise<number> {
    const last = await this.page(conversation, Number.MAX_SAFE_INTEGER, 1);
    return last[0]?.seq ?? 0;
  }

  async cursor(): Promise<Cursor | undefined> {
    return (await done(this.tx("meta", "readonly").get("cursor"))) as Cursor | undefined;
  }

  async setCursor(cursor: Cursor): Promise<void> {
    await done(this.tx("meta", "readwrite").put(cursor, "cursor"));
  }

  async outbox(): Promise<OutboxEntry[]> {
    const all = (await done(this.tx("outbox", "readonly").getAll())) as OutboxEntry[];
    return all.sort((a, b) => a.createdAtMs - b.createdAtMs);
  }

  async putOutbox(entry: OutboxEntry): Promise<void> {
    await done(this.tx("outbox", "readwrite").put(entry));
  }

  async deleteOutbox(clientReqId: string): Promise<void> {
    await done(this.tx("outbox", "readwrite").delete(clientReqId));
  }
}
