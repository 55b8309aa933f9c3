//! What a backup needs from RocksDB: a checkpoint (the live SST files
//! hard-linked, the rest copied, taken after a flush of every column
//! family, so it is one consistent point), the marks a backup's manifest
//! records, and — on a database restored from a backup — the changes that
//! keep seqs and sync cursors from going back: each conversation resumes
//! above a floor (a recorded skip, like a failover's), every user's sync
//! queue gets a new identity (devices rebase instead of waiting for pts
//! they already passed), stored device cursors are forgotten and the
//! search index is rebuilt.

use cellmesh_proto::ids::ConversationId;
use std::path::Path;

use cellmesh_proto::storage::v1::{ConversationSeq, SeqJump};
use cellmesh_proto::v1::SkipReason;
use rocksdb::checkpoint::Checkpoint;
use rocksdb::{IteratorMode, WriteBatch, WriteOptions};

use super::keys::{self, cf, meta};
use super::{Result, Store, corrupt};
use prost::Message as _;

/// A user's sync queue here: (tenant, user, queue id).
pub type Queue = (u64, u64, u64);

impl Store {
    /// Writes a consistent copy of the database into `into` (which must not
    /// exist): SST files are hard links, so this is cheap on one file system.
    pub fn checkpoint(&self, into: &Path) -> Result<()> {
        Checkpoint::new(&self.db)?.create_checkpoint(into)?;
        Ok(())
    }

    /// Every user with a sync queue here and its identity.
    pub fn queues(&self) -> Result<Vec<Queue>> {
        let mut out = Vec::new();
        for item in self
            .db
            .iterator_cf(self.cf(cf::QUEUE_ID), IteratorMode::Start)
        {
            let (k, v) = item?;
            let (Some(tenant), Some(user), Some(id)) = (
                k.get(..8).and_then(keys::decode_u64),
                keys::last_u64(&k),
                keys::decode_u64(&v),
            ) else {
                return Err(corrupt(cf::QUEUE_ID, "bad record"));
            };
            out.push((tenant, user, id));
        }
        Ok(out)
    }

    /// Makes a restored database safe to serve: each of `floors`
    /// (conversation, floor) resumes above its floor, each queue of
    /// `queues` takes the new identity given, device cursors and the search
    /// index's progress are forgotten. One synced batch.
    pub fn resume_restored(&self, floors: &[(u64, u64)], queues: &[Queue]) -> Result<()> {
        let mut batch = WriteBatch::default();
        for &(conversation, floor) in floors {
            let mut seq = self.conv_seq(ConversationId(conversation))?;
            let below = seq.latest_seq.max(seq.seq_floor);
            if floor <= below {
                continue;
            }
            seq.jumps.push(SeqJump {
                first: below + 1,
                last: floor,
                epoch: 0,
                reason: SkipReason::Restore as i32,
            });
            let record = ConversationSeq {
                seq_floor: floor,
                ..seq
            };
            batch.put_cf(
                self.cf(cf::CONV_SEQ),
                keys::u64_key(conversation),
                record.encode_to_vec(),
            );
        }
        for &(tenant, user, id) in queues {
            batch.put_cf(
                self.cf(cf::QUEUE_ID),
                keys::pair_key(tenant, user),
                id.to_be_bytes(),
            );
        }
        let family = self.cf(cf::DEVICE_CURSOR);
        for item in self.db.iterator_cf(family, IteratorMode::Start) {
            batch.delete_cf(family, item?.0);
        }
        batch.delete_cf(self.cf(cf::META), meta::SEARCH_BUILT_THROUGH);
        let mut opts = WriteOptions::default();
        opts.set_sync(true);
        let written = self.db.write_opt(batch, &opts);
        self.views.queue_ids.forget();
        written?;
        Ok(())
    }
}
