//! What a cell keeps about keys it handed over by a move, and dropping its
//! copy of them once the grace period is over.

use super::keys::{self, cf};
use super::{Mutation, Op, Result, Store, corrupt};
use crate::UserKey;
use cellmesh_proto::ids::TenantId;

/// Marks of moved conversations.
pub const CONVERSATION: u8 = b'c';
/// Marks of moved user homes.
pub const USER: u8 = b'u';
/// A tenant sealed whole (id 0): expanded into the marks of its
/// conversations and homes after the seal.
pub const TENANT: u8 = b't';
/// When a user home's copy here became current (ms): imported by a move,
/// or restarted as a new queue. Not a handed-over key: [`Store::moved`]
/// lists it only when asked for this kind.
pub const CURRENT: u8 = b'q';

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

    /// Records that `user`'s home here is current as of `now_ms` (imported
    /// by a move): it is no longer a handed-over copy.
    pub fn home_current(&mut self, user: UserKey, now_ms: u64) {
        let (tenant, id) = (user.tenant, user.user.get());
        self.unmark_moved(USER, tenant, id);
        let moved = Moved {
            id,
            tenant,
            sealed_at_ms: now_ms,
        };
        self.mark_moved(CURRENT, moved);
    }

    /// Starts `user`'s queue anew here (a new queue id; pts go on): its
    /// copy was stale, so devices rebase onto the new queue instead of
    /// being handed a pts twice under the old id.
    pub fn restart_queue(&mut self, user: UserKey, now_ms: u64) {
        self.set_queue_id(user, super::sync::new_queue_id());
        self.home_current(user, now_ms);
    }
}

impl Store {
    /// When key `id` of `kind` was marked here (ms), if it is.
    fn moved_at(&self, kind: u8, tenant: TenantId, id: u64) -> Result<Option<u64>> {
        let key = keys::meta::moved(kind, tenant, id);
        match self.db.get_pinned_cf(self.cf(cf::META), key)? {
            None => Ok(None),
            Some(v) => keys::decode_u64(&v)
                .map(Some)
                .ok_or_else(|| corrupt(cf::META, "bad moved mark")),
        }
    }

    /// Whether this cell's copy of `user`'s home was handed over by a move
    /// (its home or its tenant sealed here) and has not become current
    /// again since (by a move back, or a restart): what the home appended
    /// elsewhere meanwhile is missing from it.
    pub fn home_is_stale(&self, user: UserKey) -> Result<bool> {
        let (tenant, id) = (user.tenant, user.user.get());
        let sealed = [
            self.moved_at(USER, tenant, id)?,
            self.moved_at(TENANT, tenant, 0)?,
        ]
        .into_iter()
        .flatten()
        .max();
        let Some(sealed) = sealed else {
            return Ok(false);
        };
        Ok(sealed > self.moved_at(CURRENT, tenant, id)?.unwrap_or(0))
    }

    /// Whether this cell holds any handed-over user home or tenant (what
    /// [`Store::home_is_stale`] could find), at open.
    pub(super) fn holds_handed_over_homes(&self) -> Result<bool> {
        for kind in [USER, TENANT] {
            let lower = [keys::meta::MOVED, &[kind]].concat();
            let upper = [keys::meta::MOVED, &[kind + 1]].concat();
            if !self.range(cf::META, lower, upper, 1)?.is_empty() {
                return Ok(true);
            }
        }
        Ok(false)
    }

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
