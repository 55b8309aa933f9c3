//! What a cell keeps about keys it handed over by a move, and dropping its
//! copy of them once the grace period is over.

use super::keys::{self, cf};
use super::{Mutation, Op, Result, Store, corrupt};
use cellmesh_proto::ids::TenantId;

/// Marks of moved conversations.
pub const CONVERSATION: u8 = b'c';
/// Marks of moved user homes.
pub const USER: u8 = b'u';
/// A tenant sealed whole (id 0): expanded into the marks of its
/// conversations and homes after the seal.
pub const TENANT: u8 = b't';

/// A key this cell handed over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Moved {
    pub id: u64,
    pub tenant: TenantId,
    pub sealed_at_ms: u64,
}

impl Mutation {
    pub fn mark_moved(&mut self, kind: u8, moved: Moved) {
        let key = keys::meta::moved(kind, moved.tenant, moved.id);
        self.put(cf::META, key, moved.sealed_at_ms.to_be_bytes().to_vec());
    }

    pub fn unmark_moved(&mut self, kind: u8, tenant: TenantId, id: u64) {
        let key = keys::meta::moved(kind, tenant, id);
        self.ops.push(Op::Delete(cf::META, key));
    }
}

impl Store {
    /// The keys of `kind` this cell handed over and still holds a copy of.
    pub fn moved(&self, kind: u8) -> Result<Vec<Moved>> {
        let lower = [keys::meta::MOVED, &[kind]].concat();
        let upper = [keys::meta::MOVED, &[kind + 1]].concat();
        self.moved_in(lower, upper)
    }

    /// The ids of `tenant`'s keys of `kind` this cell handed over and still
    /// holds a copy of (one range read).
    pub fn moved_of_tenant(&self, kind: u8, tenant: TenantId) -> Result<Vec<u64>> {
        let lower = keys::meta::moved(kind, tenant, 0);
        let upper = match tenant.get().checked_add(1).map(TenantId) {
            Some(next) => keys::meta::moved(kind, next, 0),
            None => [keys::meta::MOVED, &[kind + 1]].concat(),
        };
        Ok(self
            .moved_in(lower, upper)?
            .into_iter()
            .map(|m| m.id)
            .collect())
    }

    fn moved_in(&self, lower: Vec<u8>, upper: Vec<u8>) -> Result<Vec<Moved>> {
        let bad = || corrupt(cf::META, "bad moved mark");
        self.range(cf::META, lower, upper, usize::MAX)?
            .into_iter()
            .map(|(k, v)| {
                let ids = k.get(keys::meta::MOVED.len() + 1..).ok_or_else(bad)?;
                let (tenant, id) = ids.split_at_checked(8).ok_or_else(bad)?;
                Ok(Moved {
                    id: keys::decode_u64(id).ok_or_else(bad)?,
                    tenant: TenantId(keys::decode_u64(tenant).ok_or_else(bad)?),
                    sealed_at_ms: keys::decode_u64(&v).ok_or_else(bad)?,
                })
            })
            .collect()
    }
}
