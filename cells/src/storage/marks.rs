//! High-water marks in storage (DESIGN.md §6): the marks this cell holds
//! for the cells it stands by for, merged with max so that a mark never
//! goes down whatever the order pushes arrive in, and the marks of this
//! cell's own conversations (their latest seq), which it pushes.

use cellmesh_proto::ids::{ConversationId, TenantId};
use rocksdb::{IteratorMode, WriteBatch, WriteOptions};

use super::keys::{self, cf};
use super::{Result, Store, corrupt};

/// (tenant, conversation, mark).
pub type Mark = (u64, u64, u64);

impl Store {
    /// Raises the held marks of these conversations, synced before it
    /// returns (a mark acknowledged to its owner survives a crash).
    pub fn raise_high_water_marks(&self, marks: &[Mark]) -> Result<()> {
        let mut batch = WriteBatch::default();
        let family = self.cf(cf::HIGH_WATER_MARKS);
        for &(tenant, conversation, mark) in marks {
            batch.merge_cf(
                family,
                keys::pair_key(tenant, conversation),
                mark.to_be_bytes(),
            );
        }
        let mut opts = WriteOptions::default();
        opts.set_sync(true);
        self.db.write_opt(batch, &opts)?;
        Ok(())
    }

    /// The mark this cell holds for a conversation (0: none).
    pub fn high_water_mark(&self, tenant: TenantId, conversation: ConversationId) -> Result<u64> {
        match self.db.get_pinned_cf(
            self.cf(cf::HIGH_WATER_MARKS),
            keys::pair_key(tenant.get(), conversation.get()),
        )? {
            None => Ok(0),
            Some(v) => {
                keys::decode_u64(&v).ok_or_else(|| corrupt(cf::HIGH_WATER_MARKS, "bad length"))
            }
        }
    }

    /// Every held mark, in key order.
    pub fn high_water_marks(&self) -> Result<Vec<Mark>> {
        let mut out = Vec::new();
        for item in self
            .db
            .iterator_cf(self.cf(cf::HIGH_WATER_MARKS), IteratorMode::Start)
        {
            let (k, v) = item?;
            let (Some(tenant), Some(mark)) =
                (k.get(..8).and_then(keys::decode_u64), keys::decode_u64(&v))
            else {
                return Err(corrupt(cf::HIGH_WATER_MARKS, "bad record"));
            };
            out.push((tenant, keys::last_u64(&k).unwrap_or(0), mark));
        }
        Ok(out)
    }

    /// The conversations stored here with ids above `after` and their
    /// latest seq (or floor, if higher), at most `limit`.
    pub fn conversation_marks(&self, after: u64, limit: usize) -> Result<Vec<Mark>> {
        let mut out = Vec::with_capacity(limit.min(4096));
        for (id, record) in self.conversations_after(after, limit)? {
            let seq = self.conv_seq(ConversationId(id))?;
            out.push((record.tenant_id, id, seq.latest_seq.max(seq.seq_floor)));
        }
        Ok(out)
    }
}
