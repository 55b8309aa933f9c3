// cellmesh client SDK: see README.md.
export { CellmeshClient, CellmeshError, stored, type ClientOptions } from "./client.js";
export { IndexedDbStore, MemoryStore, type Cursor, type OutboxEntry, type Store, type StoredMessage } from "./store.js";
export * from "./gen/cellmesh/v1/messaging_pb.js";
export * from "./gen/cellmesh/v1/sync_pb.js";
