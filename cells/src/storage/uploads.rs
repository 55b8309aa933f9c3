//! Upload records (`uploads` column family, tenant | upload id): a file
//! reserved, completed, or recalled and waiting for its objects to go.

use cellmesh_proto::ids::TenantId;
use cellmesh_proto::storage::v1::UploadRecord;
use prost::Message;

use super::{Mutation, Result, Store, cf, keys};

impl Mutation {
    pub fn put_upload(&mut self, id: u64, record: &UploadRecord) {
        let key = keys::upload(TenantId(record.tenant_id), id);
        self.put(cf::UPLOADS, key, record.encode_to_vec());
    }

    pub fn delete_upload(&mut self, tenant: u64, id: u64) {
        let key = keys::upload(TenantId(tenant), id).to_vec();
        self.ops.push(super::Op::Delete(cf::UPLOADS, key));
    }
}

impl Store {
    pub fn upload(&self, tenant: u64, id: u64) -> Result<Option<UploadRecord>> {
        self.get_record(cf::UPLOADS, &keys::upload(TenantId(tenant), id))
    }

    /// Upload records after (tenant, id), in key order, at most `limit`
    /// (see [`UploadWalk`]).
    fn uploads_after(
        &self,
        tenant: u64,
        id: u64,
        limit: usize,
    ) -> Result<Vec<(u64, UploadRecord)>> {
        let lower = match id.checked_add(1) {
            Some(next) => keys::upload(TenantId(tenant), next),
            None => keys::upload(TenantId(tenant.saturating_add(1)), 0),
        };
        self.records(cf::UPLOADS, lower.to_vec(), vec![0xff; 17], limit)
    }

    /// Every upload record of `tenant` (for its byte count).
    pub fn uploads_of(&self, tenant: u64) -> Result<Vec<(u64, UploadRecord)>> {
        self.records(
            cf::UPLOADS,
            keys::upload(TenantId(tenant), 0).to_vec(),
            keys::upload(TenantId(tenant), u64::MAX).to_vec(),
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
        let page = store.uploads_after(self.after.0, self.after.1, 500)?;
        match page.last() {
            Some((id, last)) => self.after = (last.tenant_id, *id),
            None => self.done = true,
        }
        Ok(page)
    }
}
