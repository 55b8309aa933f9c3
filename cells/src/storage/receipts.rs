//! Read receipts as counts: the read positions of a conversation's current
//! members, found by walking its member keys and its read-state keys side by
//! side (both are conversation | user, in the same order) in one snapshot.
//! Read state left by former members is skipped.

use cellmesh_proto::ids::{ConversationId, UserId};
use rocksdb::{Direction, IteratorMode, ReadOptions};

use super::{Result, Store, cf, corrupt, keys};

impl Store {
    /// The read position of every current member of `conversation`, in
    /// ascending order (0 for a member who has read nothing).
    pub fn member_read_positions(&self, conversation: ConversationId) -> Result<Vec<u64>> {
        let lower = keys::member(conversation, UserId(0));
        let upper = keys::member(conversation, UserId(u64::MAX));
        let snapshot = self.db.snapshot();
        let walk = |name: &'static str| {
            let mut opts = ReadOptions::default();
            opts.set_iterate_upper_bound(upper.to_vec());
            opts.set_snapshot(&snapshot);
            self.db.iterator_cf_opt(
                self.cf(name),
                opts,
                IteratorMode::From(&lower, Direction::Forward),
            )
        };
        let mut reads = walk(cf::READ_STATE);
        let mut read = reads.next().transpose()?;
        let mut positions = Vec::new();
        for member in walk(cf::MEMBERS) {
            let (member, _) = member?;
            // Skip read state of users who are no longer members.
            while read.as_ref().is_some_and(|(k, _)| k[..] < member[..]) {
                read = reads.next().transpose()?;
            }
            let position = match &read {
                Some((k, v)) if k[..] == member[..] => {
                    keys::decode_u64(v).ok_or_else(|| corrupt(cf::READ_STATE, "bad length"))?
                }
                _ => 0,
            };
            positions.push(position);
        }
        positions.sort_unstable();
        Ok(positions)
    }
}
