//! Every cross-crate integration test, in one binary (one link of RocksDB
//! instead of one per file). Each module is one area of behaviour.

mod bad_input;
mod chat_cli;
mod check_config;
mod cold_moves;
mod cold_tier;
mod commit_lanes;
mod console;
mod coordination;
mod dev;
mod drill;
mod durability;
mod edge;
mod exactly_once;
mod failover;
mod history;
mod homes;
mod kafka_queue;
mod metrics;
mod migration;
mod operations;
mod presence;
mod process_failover;
mod processor_crash;
mod reflection;
mod router;
mod send;
mod standard_errors;
mod sync;
mod sync_replication;
mod tenant_move;
mod tenant_reverse;
mod tenants;
mod tls;
mod traces;
mod user_move;
