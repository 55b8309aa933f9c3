//! Upload records (`uploads` column family, tenant | upload id): a file
//! reserved, completed, or recalled and waiting for its objects to go;
//! and in `meta`, each conversation's open uploads (`open_upload/`), which
//! a move carries to the new owner.

use cellmesh_proto::ids::{ConversationId, TenantId};
use cellmesh_proto::storage::v1::UploadRecord;
use prost::Message;

use super::{Mutation, Result, Store, cf, keys};

impl Mutation {
    /// Stores `record` and keeps its conversation's index of open uploads
    /// (see [`is_open`]) in step.
    pub fn put_upload(&mut self, id: u64, record: &UploadRecord) {
        let key = keys::upload(TenantId(record.tenant_id), id);
        self.put(cf::UPLOADS, key, record.encode_to_vec());
        let open = keys::meta::open_upload(ConversationId(record.conversation_id), id);
        match is_open(record) {
            true => self.put(cf::META, open, (record.state as u64).to_be_bytes().to_vec()),
            false => self.ops.push(super::Op::Delete(cf::META, open)),
        }
    }

    pub fn delete_upload(&mut self, record: &UploadRecord, id: u64) {
        let key = keys::upload(TenantId(record.tenant_id), id).to_vec();
        self.ops.push(super::Op::Delete(cf::UPLOADS, key));
        let open = keys::meta::open_upload(ConversationId(record.conversation_id), id);
        self.ops.push(super::Op::Delete(cf::META, open));
    }
}

/// An upload no message carries and nothing deletes yet: reserved, or
/// completed and not sent. A move carries these to the new owner.
pub fn is_open(record: &UploadRecord) -> bool {
    !record.referenced && record.delete_after_ms == 0
}

impl Store {
    pub fn upload(&self, tenant: TenantId, id: u64) -> Result<Option<UploadRecord>> {
        self.get_record(cf::UPLOADS, &keys::upload(tenant, id))
    }

    /// Upload records after (tenant, id), in key order, at most `limit`
    /// (see [`UploadWalk`]).
    fn uploads_after(
        &self,
        tenant: TenantId,
        id: u64,
        limit: usize,
    ) -> Result<Vec<(u64, UploadRecord)>> {
        let lower = match id.checked_add(1) {
            Some(next) => keys::upload(tenant, next),
            None => keys::upload(TenantId(tenant.get().saturating_add(1)), 0),
        };
        self.records(cf::UPLOADS, lower.to_vec(), vec![0xff; 17], limit)
    }

    /// The index entries of `conversation`'s open uploads: id and state.
    fn open_upload_index(&self, conversation: ConversationId) -> Result<Vec<(u64, u64)>> {
        let prefix = keys::meta::open_uploads_of(conversation);
        let upper = [prefix.as_slice(), &[0xff]].concat();
        (self.range(cf::META, prefix, upper, usize::MAX)?.iter())
            .map(|(key, state)| {
                let id =
                    keys::last_u64(key).ok_or_else(|| super::corrupt(cf::META, "short key"))?;
                Ok((id, keys::decode_u64(state).unwrap_or(0)))
            })
            .collect()
    }

    /// The open uploads of `conversation` (see [`is_open`]), in id order.
    pub fn open_uploads(
        &self,
        tenant: TenantId,
        conversation: ConversationId,
    ) -> Result<Vec<(u64, UploadRecord)>> {
        let mut open = Vec::new();
        for (id, _) in self.open_upload_index(conversation)? {
            if let Some(record) = self.upload(tenant, id)?
                && record.conversation_id == conversation.get()
                && is_open(&record)
            {
                open.push((id, record));
            }
        }
        Ok(open)
    }

    /// A digest of `conversation`'s open uploads and their states (0: none),
    /// from the index alone.
    pub fn open_uploads_digest(&self, conversation: ConversationId) -> Result<u64> {
        let entries = self.open_upload_index(conversation)?;
        Ok((entries.iter()).fold(0u64, |digest, (id, state)| {
            digest.wrapping_add(mix(id ^ state.rotate_right(8)))
        }))
    }

    /// Gives every open upload record its index key, once (stores written
    /// before the index existed); how many it indexed.
    pub async fn index_open_uploads(&self) -> Result<usize> {
        if self.meta_u64(keys::meta::OPEN_UPLOADS_INDEXED)?.is_some() {
            return Ok(0);
        }
        let (mut walk, mut indexed) = (UploadWalk::default(), 0);
        loop {
            let page = walk.next(self)?;
            if page.is_empty() {
                break;
            }
            let mut m = Mutation::new();
            for (id, record) in page.iter().filter(|(_, r)| is_open(r)) {
                m.put_upload(*id, record);
                indexed += 1;
            }
            if !m.is_empty() {
                self.commit(m).await?;
            }
        }
        self.put_meta_u64_sync(keys::meta::OPEN_UPLOADS_INDEXED, 1)?;
        Ok(indexed)
    }

    /// Every upload record of `tenant` (for its byte count).
    pub fn uploads_of(&self, tenant: TenantId) -> Result<Vec<(u64, UploadRecord)>> {
        self.records(
            cf::UPLOADS,
            keys::upload(tenant, 0).to_vec(),
            keys::upload(tenant, u64::MAX).to_vec(),
            usize::MAX,
        )
    }
}

/// A walk over every upload record, a page at a time (the sweeper's and
/// the copier's).
#[derive(Default)]
pub struct UploadWalk {
    after: (u64, u64),
    done: bool,
}

impl UploadWalk {
    /// The next page; empty once every record was seen.
    pub fn next(&mut self, store: &Store) -> Result<Vec<(u64, UploadRecord)>> {
        if self.done {
            return Ok(Vec::new());
        }
        let page = store.uploads_after(TenantId(self.after.0), self.after.1, 500)?;
        match page.last() {
            Some((id, last)) => self.after = (last.tenant_id, *id),
            None => self.done = true,
        }
        Ok(page)
    }
}

/// splitmix64's finalizer: spreads an id over the whole u64.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::testing::store;

    fn record(conversation: u64, referenced: bool) -> UploadRecord {
        UploadRecord {
            tenant_id: 1,
            conversation_id: conversation,
            referenced,
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn the_index_lists_a_conversations_open_uploads_only() {
        let (_dir, store) = store();
        let mut m = Mutation::new();
        m.put_upload(10, &record(5, false));
        m.put_upload(11, &record(5, false));
        m.put_upload(12, &record(6, false));
        m.put_upload(13, &record(5, true));
        store.commit(m).await.unwrap();
        let ids =
            |open: Vec<(u64, UploadRecord)>| open.into_iter().map(|(id, _)| id).collect::<Vec<_>>();
        assert_eq!(
            ids(store.open_uploads(TenantId(1), ConversationId(5)).unwrap()),
            vec![10, 11]
        );
        let before = store.open_uploads_digest(ConversationId(5)).unwrap();
        assert_ne!(before, 0);
        assert_eq!(
            store.open_uploads_digest(ConversationId(9)).unwrap(),
            0,
            "none open"
        );
        // Completing one changes the digest.
        let mut m = Mutation::new();
        m.put_upload(
            11,
            &UploadRecord {
                state: 2,
                ..record(5, false)
            },
        );
        store.commit(m).await.unwrap();
        assert_ne!(
            store.open_uploads_digest(ConversationId(5)).unwrap(),
            before
        );
        assert!(
            store
                .open_uploads(TenantId(2), ConversationId(5))
                .unwrap()
                .is_empty(),
            "another tenant's"
        );
        // Sent, or deleted: no longer open.
        let mut m = Mutation::new();
        m.put_upload(10, &record(5, true));
        m.delete_upload(&record(5, false), 11);
        store.commit(m).await.unwrap();
        assert!(
            store
                .open_uploads(TenantId(1), ConversationId(5))
                .unwrap()
                .is_empty()
        );
        assert_eq!(
            ids(store.open_uploads(TenantId(1), ConversationId(6)).unwrap()),
            vec![12]
        );
    }

    #[tokio::test]
    async fn a_store_from_before_the_index_gets_it_once() {
        let (_dir, store) = store();
        let mut m = Mutation::new();
        m.put(
            cf::UPLOADS,
            keys::upload(TenantId(1), 20),
            record(7, false).encode_to_vec(),
        );
        m.put(
            cf::UPLOADS,
            keys::upload(TenantId(1), 21),
            record(7, true).encode_to_vec(),
        );
        store.commit(m).await.unwrap();
        assert!(
            store
                .open_uploads(TenantId(1), ConversationId(7))
                .unwrap()
                .is_empty()
        );
        assert_eq!(store.index_open_uploads().await.unwrap(), 1);
        assert_eq!(
            store
                .open_uploads(TenantId(1), ConversationId(7))
                .unwrap()
                .len(),
            1
        );
        assert_eq!(store.index_open_uploads().await.unwrap(), 0, "once");
    }
}
