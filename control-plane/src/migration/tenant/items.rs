//! What a tenant move carries, item by item: each conversation's history
//! and each member's home, with how far the target holds it, how far the
//! source had it when last asked, and what was verified. Copy rounds,
//! digests and their comparison are done here for all items at once,
//! several calls in flight; the workflow in [`super`] decides when.

use cellmesh_proto::ids::{ConversationId, TenantId, UserId};
use std::collections::BTreeMap;

use cellmesh_proto::v1::{
    Copied, CopyManyRequest, CopyRequest, CopyResponse, CopyUserRequest, CopyUsersRequest,
    DigestRequest, DigestResponse, ExportPosition, Mark, TenantMarksRequest, TenantMarksResponse,
    UserDigestRequest, UserPosition,
};
use cellmesh_route_client::table::{Key, RouteState};
use futures::StreamExt;

use super::super::{MigrationError, Migrator, Peer, call};

/// Conversations copied in one call.
const BATCH_CONVERSATIONS: usize = 64;
/// A conversation at most this far behind is copied in a batch.
const BATCH_MESSAGES: u64 = 1_000;

/// A batch copy's answer for one item, as a single copy's.
fn answer(r: &Copied) -> CopyResponse {
    CopyResponse {
        copied_through: r.copied_through,
        messages: r.messages,
        source_latest_seq: r.source_latest_seq,
        bytes: r.bytes,
    }
}

/// One thing that moves with the tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Item {
    Conversation(u64),
    /// A user's home: sync queue, conversation list, mute flags, cursors.
    User(u64),
}

/// What was compared and found equal on both cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Verified {
    pub through: u64,
    pub count: u64,
    pub checksum: u64,
    pub rewrites: u64,
}

/// Where one item stands.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Position {
    /// The target holds everything through this.
    pub copied: u64,
    /// The source's latest position when last asked.
    pub source: u64,
    /// The next copy replaces what the target holds (user homes: a target
    /// may hold an older queue of the user).
    pub reset: bool,
    /// The source's rewrite count when last asked (conversations).
    pub rewrites: u64,
    /// The digest of the source's open uploads when last asked
    /// (conversations), and whether the target may not hold them as that:
    /// the next round copies the conversation even with no new message.
    pub uploads: u64,
    pub uploads_behind: bool,
    pub verified: Option<Verified>,
}

/// The two cells and every item between them.
pub(super) struct Items<'a> {
    pub migrator: &'a Migrator,
    pub tenant: TenantId,
    pub from: String,
    pub to: String,
    pub source: Peer,
    pub source_address: String,
    pub target: Peer,
    pub parallel: usize,
    pub items: BTreeMap<Item, Position>,
    /// Messages and events copied in this run.
    pub copied_rows: u64,
    /// Encoded bytes the target stored so far.
    pub copied_bytes: u64,
    /// Members of the tenant's conversations on the target (created there
    /// during the move): their homes are on the source until the switch.
    pub target_users: Vec<u64>,
    /// The source's token of its last answer taken in: the next asks only
    /// what changed since (0: everything).
    pub token: u64,
    /// The same of the target, for its members.
    pub target_token: u64,
}

/// Both cells' answer for one item.
type Pair = (DigestResponse, DigestResponse);

impl Items<'_> {
    /// Every user the items or the target's conversations name (asked
    /// for on both cells).
    fn users(&self) -> Vec<u64> {
        let mut users: Vec<u64> = self
            .items
            .keys()
            .filter_map(|i| match i {
                Item::User(u) => Some(*u),
                Item::Conversation(_) => None,
            })
            .chain(self.target_users.iter().copied())
            .collect();
        users.sort_unstable();
        users.dedup();
        users
    }

    /// Takes in the members of the tenant's conversations on the target
    /// (all of them at first, then those of conversations written there
    /// since the last call).
    pub async fn refresh_target_users(&mut self) -> Result<(), MigrationError> {
        let changes = self.target_changes().await?;
        self.note_target_users(changes);
        Ok(())
    }

    /// The target's answer of who is a member there now (see
    /// [`Items::refresh_target_users`]).
    async fn target_changes(&self) -> Result<TenantMarksResponse, MigrationError> {
        let request = self.migrator.request(TenantMarksRequest {
            tenant_id: self.tenant.get(),
            since: self.target_token,
            ..TenantMarksRequest::default()
        });
        Ok(self
            .target
            .clone()
            .tenant_marks(request)
            .await
            .map_err(call("the tenant's members on the target"))?
            .into_inner())
    }

    /// Takes in a [`Items::target_changes`] answer; the users new to it.
    fn note_target_users(&mut self, changes: TenantMarksResponse) -> Vec<u64> {
        if changes.complete {
            self.target_users.clear();
        }
        let known: std::collections::HashSet<u64> = self.target_users.iter().copied().collect();
        let new: Vec<u64> = (changes.users.iter().map(|m| m.id))
            .filter(|u| !known.contains(u))
            .collect();
        self.target_users.extend(&new);
        self.target_users.sort_unstable();
        self.target_token = changes.token;
        new
    }

    /// Seals the tenant on the source at `epoch` and answers its final
    /// marks. The target's members are listed meanwhile: those the seal
    /// did not name (members of a conversation created on the target since
    /// the last listing) are sealed and reported by a second, users-only
    /// call.
    pub async fn seal(&mut self, epoch: u64) -> Result<TenantMarksResponse, MigrationError> {
        let (changes, sealed) =
            tokio::join!(self.target_changes(), self.marks(true, Some(epoch), false));
        let (changes, mut sealed) = (changes?, sealed?);
        let named: std::collections::HashSet<u64> = self
            .users()
            .into_iter()
            .chain(sealed.users.iter().map(|m| m.id))
            .collect();
        let unnamed: Vec<u64> = (self.note_target_users(changes).into_iter())
            .filter(|u| !named.contains(u))
            .collect();
        if !unnamed.is_empty() {
            let request = self.migrator.request(TenantMarksRequest {
                tenant_id: self.tenant.get(),
                seal: true,
                epoch,
                with_digest: false,
                users: unnamed,
                only_users: true,
                since: 0,
            });
            let more = self
                .source
                .clone()
                .tenant_marks(request)
                .await
                .map_err(call("seal the tenant's users on the source"))?
                .into_inner();
            sealed.users.extend(more.users);
        }
        Ok(sealed)
    }

    /// The marks of the tenant on `peer` (see `CellPeer.TenantMarks`):
    /// everything, or on the source without a digest only what changed
    /// since the last answer taken in (with [`Items::note_source`]).
    pub async fn marks(
        &self,
        on_source: bool,
        seal_epoch: Option<u64>,
        with_digest: bool,
    ) -> Result<TenantMarksResponse, MigrationError> {
        let since = if on_source && !with_digest {
            self.token
        } else {
            0
        };
        let users = if since == 0 {
            self.users()
        } else {
            // Homes the source does not know about: named on the target
            // since the last answer.
            (self.target_users.iter().copied())
                .filter(|u| !self.items.contains_key(&Item::User(*u)))
                .collect()
        };
        let request = self.migrator.request(TenantMarksRequest {
            tenant_id: self.tenant.get(),
            seal: seal_epoch.is_some(),
            epoch: seal_epoch.unwrap_or(0),
            with_digest,
            users,
            only_users: false,
            since,
        });
        let mut peer = if on_source {
            self.source.clone()
        } else {
            self.target.clone()
        };
        let what = if seal_epoch.is_some() {
            "seal the tenant on the source"
        } else if on_source {
            "the tenant's marks on the source"
        } else {
            "the tenant's marks on the target"
        };
        Ok(peer
            .tenant_marks(request)
            .await
            .map_err(call(what))?
            .into_inner())
    }

    /// Adds the items `marks` name that move with the tenant (`keep` says
    /// which: not those with a route of their own), and records the
    /// source's positions. A user home new here is copied afresh.
    pub fn note_source(&mut self, marks: &TenantMarksResponse, keep: impl Fn(Item) -> bool) {
        let all = marks
            .conversations
            .iter()
            .map(|m| (Item::Conversation(m.id), m))
            .chain(marks.users.iter().map(|m| (Item::User(m.id), m)));
        for (item, mark) in all {
            if !keep(item) {
                continue;
            }
            let position = self.items.entry(item).or_insert_with(|| Position {
                reset: matches!(item, Item::User(_)),
                ..Position::default()
            });
            (position.source, position.rewrites) = (mark.latest, mark.rewrites);
            if position.uploads != mark.uploads {
                (position.uploads, position.uploads_behind) = (mark.uploads, true);
            }
        }
        self.token = marks.token;
    }

    /// Takes what the target holds already as copied: conversations
    /// (copying is idempotent, and verification catches a stale copy), and
    /// the user homes it handed over itself in an earlier move (a move
    /// back: its sealed copy is a prefix of the source's), which then copy
    /// only what came after instead of afresh.
    pub fn note_target(&mut self, marks: &TenantMarksResponse) {
        for m in &marks.conversations {
            if let Some(p) = self.items.get_mut(&Item::Conversation(m.id)) {
                p.copied = m.latest;
            }
        }
        for m in marks.users.iter().filter(|m| m.handed_over) {
            if let Some(p) = self.items.get_mut(&Item::User(m.id))
                && m.latest <= p.source
            {
                (p.copied, p.reset) = (m.latest, false);
            }
        }
    }

    /// How far the target is behind the source, in messages and events.
    pub fn lag(&self) -> u64 {
        self.items
            .values()
            .map(|p| p.source.saturating_sub(p.copied))
            .sum()
    }

    /// How many items the target holds up to the source's last answer.
    pub fn in_step(&self) -> u64 {
        self.items
            .values()
            .filter(|p| !p.reset && p.copied >= p.source)
            .count() as u64
    }

    /// Copies every item the target is behind on, `parallel` at a time,
    /// at most `options.rate` rows a second; `tick` sees how many items of
    /// the round are done and the rows and bytes copied so far.
    pub async fn copy_round(
        &mut self,
        mut tick: impl FnMut(u64, u64, u64),
    ) -> Result<(), MigrationError> {
        let (started, rate) = (std::time::Instant::now(), self.migrator.options.rate);
        let rows_before = self.copied_rows;
        let behind: Vec<(Item, Position)> = self
            .items
            .iter()
            .filter(|(_, p)| p.reset || p.copied < p.source || p.uploads_behind)
            .map(|(i, p)| (*i, *p))
            .collect();
        // Conversations a little behind go many to a call; the others (and
        // homes) one by one, each call copying all the source holds.
        let small = |p: &Position| {
            p.source.saturating_sub(if p.reset { 0 } else { p.copied }) <= BATCH_MESSAGES
        };
        let (conversations, rest): (Vec<_>, Vec<_>) = behind
            .into_iter()
            .partition(|(item, p)| matches!(item, Item::Conversation(_)) && small(p));
        let (users, single): (Vec<_>, Vec<_>) = rest
            .into_iter()
            .partition(|(item, p)| matches!(item, Item::User(_)) && small(p));
        let mut jobs: Vec<Vec<(Item, Position)>> = conversations
            .chunks(BATCH_CONVERSATIONS)
            .chain(users.chunks(BATCH_CONVERSATIONS))
            .map(<[_]>::to_vec)
            .collect();
        jobs.extend(single.into_iter().map(|one| vec![one]));
        let this = &*self;
        let copies = jobs.into_iter().map(|job| async move {
            this.hold().await?;
            match job.as_slice() {
                [(Item::User(u), p)] if !small(p) => Ok(vec![(
                    Item::User(*u),
                    this.copy_user(UserId(*u), p.copied, p.reset).await?,
                )]),
                [(Item::Conversation(c), p)] if !small(p) => Ok(vec![(
                    Item::Conversation(*c),
                    this.copy_conversation(ConversationId(*c), p.copied).await?,
                )]),
                many => this.copy_batch(many).await,
            }
        });
        let mut copies = futures::stream::iter(copies).buffer_unordered(this.parallel.max(1));
        let mut done = Vec::new();
        let (mut rows, mut bytes) = (rows_before, self.copied_bytes);
        while let Some(answers) = copies.next().await {
            for (item, answer) in answers? {
                rows += answer.messages;
                bytes += answer.bytes;
                done.push((item, answer));
            }
            tick(done.len() as u64, rows, bytes);
            if rate > 0 {
                let due =
                    std::time::Duration::from_secs_f64((rows - rows_before) as f64 / rate as f64);
                tokio::time::sleep_until((started + due).into()).await;
            }
        }
        drop(copies);
        for (item, answer) in done {
            let p = self.items.get_mut(&item).expect("an item copied is known");
            self.copied_rows += answer.messages;
            self.copied_bytes += answer.bytes;
            if p.reset {
                p.copied = 0;
                p.reset = false;
            }
            p.copied = p.copied.max(answer.copied_through);
            // Every copy carries the open uploads as the source held them.
            p.uploads_behind = false;
        }
        Ok(())
    }

    /// Waits while an operator holds the move (the tenant's entry
    /// `Migrating/Paused`) before the next copy starts; nothing holds a
    /// frozen tenant.
    pub async fn hold(&self) -> Result<(), MigrationError> {
        let key = Key::tenant(self.tenant);
        let migrating = self.migrator.routes.read(|t| {
            t.entry(&key).is_some_and(
                |e| matches!(&e.state, RouteState::Migrating { to, .. } if *to == self.to),
            )
        });
        if migrating {
            (self.migrator)
                .hold_while_paused(&key, &self.to, 0, 0, &mut |_| {})
                .await?;
        }
        Ok(())
    }

    /// Copies a batch of conversations, or of homes (a batch holds one
    /// kind), each a little behind, in one call; what each got.
    async fn copy_batch(
        &self,
        many: &[(Item, Position)],
    ) -> Result<Vec<(Item, CopyResponse)>, MigrationError> {
        let mut target = self.target.clone();
        let (kind, copied): (fn(u64) -> Item, _) = match many.first() {
            Some((Item::User(_), _)) => {
                let items = many
                    .iter()
                    .filter_map(|(item, p)| match item {
                        Item::User(u) => Some(UserPosition {
                            user_id: *u,
                            after_pts: if p.reset { 0 } else { p.copied },
                            reset: p.reset,
                        }),
                        Item::Conversation(_) => None,
                    })
                    .collect();
                let copy = CopyUsersRequest {
                    source_address: self.source_address.clone(),
                    tenant_id: self.tenant.get(),
                    items,
                    limit: BATCH_MESSAGES as u32,
                    source_cell: self.from.clone(),
                };
                let copied = target.copy_users(self.migrator.request(copy)).await;
                (Item::User, copied.map_err(call("copy user homes"))?)
            }
            _ => {
                let items = many
                    .iter()
                    .filter_map(|(item, p)| match item {
                        Item::Conversation(c) => Some(ExportPosition {
                            conversation_id: *c,
                            after_seq: p.copied,
                        }),
                        Item::User(_) => None,
                    })
                    .collect();
                let copy = CopyManyRequest {
                    source_address: self.source_address.clone(),
                    tenant_id: self.tenant.get(),
                    items,
                    limit: BATCH_MESSAGES as u32,
                };
                let copied = target.copy_conversations(self.migrator.request(copy)).await;
                (
                    Item::Conversation,
                    copied.map_err(call("copy conversations"))?,
                )
            }
        };
        Ok(copied
            .into_inner()
            .results
            .into_iter()
            .map(|r| (kind(r.id), answer(&r)))
            .collect())
    }

    async fn copy_conversation(
        &self,
        conversation: ConversationId,
        after: u64,
    ) -> Result<CopyResponse, MigrationError> {
        let options = &self.migrator.options;
        let copy = CopyRequest {
            source_address: self.source_address.clone(),
            tenant_id: self.tenant.get(),
            conversation_id: conversation.get(),
            after_seq: after,
            max_messages: options.round_messages,
            chunk: options.chunk,
            backfill: false,
        };
        let mut target = self.target.clone();
        Ok(target
            .copy_conversation(self.migrator.request(copy))
            .await
            .map_err(call("copy a conversation"))?
            .into_inner())
    }

    async fn copy_user(
        &self,
        user: UserId,
        after: u64,
        reset: bool,
    ) -> Result<CopyResponse, MigrationError> {
        let copy = CopyUserRequest {
            source_address: self.source_address.clone(),
            tenant_id: self.tenant.get(),
            user_id: user.get(),
            after_pts: if reset { 0 } else { after },
            chunk: self.migrator.options.chunk,
            reset,
            source_cell: self.from.clone(),
        };
        let mut target = self.target.clone();
        Ok(target
            .copy_user(self.migrator.request(copy))
            .await
            .map_err(call("copy a user home"))?
            .into_inner())
    }

    /// Compares whole digests while writes still flow: an item the target
    /// holds up to the source's mark and that agrees is verified through
    /// there; one that disagrees is copied again from the start. How many
    /// disagreed.
    pub async fn verify_copied(&mut self) -> Result<u64, MigrationError> {
        let (source, target) =
            tokio::join!(self.marks(true, None, true), self.marks(false, None, true));
        let (source, target) = (source?, target?);
        let index = |r: &TenantMarksResponse| -> BTreeMap<Item, Mark> {
            r.conversations
                .iter()
                .map(|m| (Item::Conversation(m.id), *m))
                .chain(r.users.iter().map(|m| (Item::User(m.id), *m)))
                .collect()
        };
        let (source, target) = (index(&source), index(&target));
        let mut disagree = 0;
        for (item, p) in self.items.iter_mut() {
            let (Some(a), Some(b)) = (source.get(item), target.get(item)) else {
                continue;
            };
            if p.copied != a.latest || b.latest != a.latest {
                // Not caught up with this mark: verified at the end.
                continue;
            }
            if (a.count, a.checksum) == (b.count, b.checksum) {
                p.verified = Some(Verified {
                    through: a.latest,
                    count: a.count,
                    checksum: a.checksum,
                    rewrites: a.rewrites,
                });
            } else {
                disagree += 1;
                p.verified = None;
                (p.copied, p.reset) = (0, true);
            }
        }
        Ok(disagree)
    }

    /// Under the freeze, with the source's final `sealed` marks and every
    /// item copied through them: compares what changed since it was
    /// verified (everything, for an item never verified or whose older
    /// messages were rewritten). The first item that disagrees.
    pub async fn verify_final(&self) -> Result<Option<(Item, Pair)>, MigrationError> {
        let mut checks = Vec::new();
        for (&item, p) in &self.items {
            let base = p.verified.filter(|v| match item {
                Item::Conversation(_) => p.rewrites == v.rewrites,
                Item::User(_) => true,
            });
            if base.is_none_or(|v| v.through < p.source) {
                checks.push((item, base, p.source));
            }
        }
        let compared = checks.into_iter().map(|(item, base, through)| async move {
            let after = base.map_or(0, |v| v.through);
            let (mut a, mut b) = self.digests(item, after, through).await?;
            if let Some(v) = base {
                for d in [&mut a, &mut b] {
                    d.count += v.count;
                    d.checksum = d.checksum.wrapping_add(v.checksum);
                }
            }
            let exact = matches!(item, Item::User(_));
            let agree = (a.count, a.checksum) == (b.count, b.checksum)
                && (!exact || b.latest_seq == through);
            Ok::<_, MigrationError>((!agree).then_some((item, (a, b))))
        });
        let mut compared = futures::stream::iter(compared).buffer_unordered(self.parallel.max(1));
        while let Some(result) = compared.next().await {
            if let Some(mismatch) = result? {
                return Ok(Some(mismatch));
            }
        }
        Ok(None)
    }

    /// Source and target digests of `item` in `(after, through]`.
    async fn digests(&self, item: Item, after: u64, through: u64) -> Result<Pair, MigrationError> {
        let (mut source, mut target) = (self.source.clone(), self.target.clone());
        let m = self.migrator;
        let (a, b) = match item {
            Item::Conversation(c) => {
                let d = DigestRequest {
                    conversation_id: c,
                    after_seq: after,
                    through_seq: through,
                };
                tokio::join!(
                    source.conversation_digest(m.request(d)),
                    target.conversation_digest(m.request(d))
                )
            }
            Item::User(u) => {
                let d = UserDigestRequest {
                    tenant_id: self.tenant.get(),
                    user_id: u,
                    after_seq: after,
                    through_seq: through,
                };
                tokio::join!(
                    source.user_digest(m.request(d)),
                    target.user_digest(m.request(d))
                )
            }
        };
        super::super::both(a, b)
    }
}
