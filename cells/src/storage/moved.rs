//! What a cell keeps about keys it handed over by a move, and dropping its
//! copy of them once the grace period is over.

use super::keys::{self, cf};
use super::{Mutation, Op, Result, Store, corrupt};

/// Marks of moved conversations.
pub const CONVERSATION: u8 = b'c';
/// Marks of moved user homes.
pub const USER: u8 = b'u';

/// A key this cell handed over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Moved {
    pub id: u64,
    pub tenant: u64,
    pub sealed_at_ms: u64,
}

impl Mutation {
    pub fn mark_moved(&mut self, kind: u8, moved: Moved) {
        let value = [moved.tenant.to_be_bytes(), moved.sealed_at_ms.to_be_bytes()].concat();
        self.put(cf::META, keys::meta::moved(kind, moved.id), value);
    }

    pub fn unmark_moved(&mut self, kind: u8, id: u64) {
        self.ops
            .push(Op::Delete(cf::META, keys::meta::moved(kind, id)));
    }

    /// Drops a conversation's history, read positions and hidden marks;
    /// its record and members stay (a standby's copy, tenant listings).
    pub fn drop_history(&mut self, conversation: u64) {
        let (from, to) = keys::prefixed_by(conversation);
        for name in [cf::MESSAGES, cf::READ_STATE, cf::HIDDEN] {
            self.ops
                .push(Op::DeleteRange(name, from.clone(), to.clone()));
        }
        self.ops.push(Op::Delete(
            cf::CONV_SEQ,
            keys::u64_key(conversation).to_vec(),
        ));
    }
}

impl Store {
    /// The keys of `kind` this cell handed over and still holds a copy of.
    pub fn moved(&self, kind: u8) -> Result<Vec<Moved>> {
        let lower = keys::meta::moved(kind, 0);
        let upper = [b"moved/".as_slice(), &[kind + 1]].concat();
        self.range(cf::META, lower, upper, usize::MAX)?
            .into_iter()
            .map(|(k, v)| {
                let id = keys::last_u64(&k).ok_or_else(|| corrupt(cf::META, "short key"))?;
                let (tenant, at) = v
                    .split_at_checked(8)
                    .ok_or_else(|| corrupt(cf::META, "bad length"))?;
                Ok(Moved {
                    id,
                    tenant: keys::decode_u64(tenant)
                        .ok_or_else(|| corrupt(cf::META, "bad length"))?,
                    sealed_at_ms: keys::decode_u64(at)
                        .ok_or_else(|| corrupt(cf::META, "bad length"))?,
                })
            })
            .collect()
    }
}
