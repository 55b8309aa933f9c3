// The conversation view: a virtualised list of fixed-height rows. Only
// the rows in sight (and a few either side) are in the DOM, whatever the
// number of messages loaded; scrolling to the top asks for the page
// before; a new message at the bottom keeps the view pinned there.

import type { StoredMessage } from "../src/store.js";

const ROW = 48;
const OVERSCAN = 8;

export class MessageList {
  private messages: StoredMessage[] = [];
  private rows = new Map<string, HTMLElement>();
  private loadingOlder = false;

  constructor(
    private viewport: HTMLElement,
    private spacer: HTMLElement,
    private render: (m: StoredMessage) => HTMLElement,
    private older: (beforeSeq: number) => Promise<StoredMessage[]>,
  ) {
    viewport.addEventListener("scroll", () => {
      this.paint();
      if (viewport.scrollTop < ROW * 2) void this.loadOlder();
    });
  }

  /** Replaces everything (another conversation was opened). */
  reset(messages: StoredMessage[]): void {
    this.messages = [];
    for (const row of this.rows.values()) row.remove();
    this.rows.clear();
    this.merge(messages);
    this.viewport.scrollTop = this.spacer.offsetHeight;
    this.paint();
  }

  /** Inserts or replaces by msg_id (an edit or a recall replaces). New
   * messages above the last one are appended (the common case, O(new)). */
  merge(messages: StoredMessage[]): void {
    if (messages.length === 0) return;
    const atBottom = this.viewport.scrollTop + this.viewport.clientHeight >= this.spacer.offsetHeight - ROW;
    const last = this.messages[this.messages.length - 1]?.seq ?? -1;
    const firstSeq = this.messages[0]?.seq ?? Infinity;
    let prepended = 0;
    const incoming = [...messages].sort((a, b) => a.seq - b.seq);
    if (incoming.every((m) => m.seq > last)) {
      const seen = new Set<string>();
      for (const m of incoming) if (!seen.has(m.msgId) && seen.add(m.msgId)) this.messages.push(m);
    } else {
      const byId = new Map(this.messages.map((m) => [m.msgId, m]));
      for (const m of incoming) {
        byId.set(m.msgId, m);
        this.rows.get(m.msgId)?.remove();
        this.rows.delete(m.msgId);
      }
      this.messages = [...byId.values()].sort((a, b) => a.seq - b.seq);
      prepended = this.messages.filter((m) => m.seq < firstSeq).length;
    }
    this.spacer.style.height = `${this.messages.length * ROW}px`;
    if (prepended > 0) this.viewport.scrollTop += prepended * ROW;
    else if (atBottom) this.viewport.scrollTop = this.spacer.offsetHeight;
    this.paint();
  }

  get loaded(): readonly StoredMessage[] {
    return this.messages;
  }

  private paint(): void {
    const first = Math.max(0, Math.floor(this.viewport.scrollTop / ROW) - OVERSCAN);
    const last = Math.min(this.messages.length, Math.ceil((this.viewport.scrollTop + this.viewport.clientHeight) / ROW) + OVERSCAN);
    const keep = new Set<string>();
    for (let i = first; i < last; i++) {
      const m = this.messages[i];
      keep.add(m.msgId);
      let row = this.rows.get(m.msgId);
      if (!row) {
        row = this.render(m);
        this.rows.set(m.msgId, row);
        this.viewport.appendChild(row);
      }
      row.style.top = `${i * ROW}px`;
    }
    for (const [id, row] of this.rows) {
      if (!keep.has(id)) {
        row.remove();
        this.rows.delete(id);
      }
    }
  }

  private async loadOlder(): Promise<void> {
    const first = this.messages[0];
    if (this.loadingOlder || !first || first.seq <= 1) return;
    this.loadingOlder = true;
    try {
      this.merge(await this.older(first.seq));
    } finally {
      this.loadingOlder = false;
    }
  }
}
