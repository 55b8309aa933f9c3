//! A large group's first screen in memory: its newest messages as stored
//! (a [`Mirror`] of its `messages` rows), so the pages its members pull
//! after a hint, or on opening it, are read without RocksDB. A screen
//! holds every row of its conversation above a seq `lo`: a send adds one,
//! a recall or edit rewrites one, tiering or a move deletes them, each as
//! the commit lanes report it. A page the screen covers is answered from
//! it, through the same viewer overlay as a page from storage (the
//! viewer's delete-for-me rows, messages directed to others); any other
//! page is read from storage.

use std::collections::BTreeMap;
use std::sync::Arc;

use cellmesh_proto::ids::{ConversationId, Seq};
use cellmesh_proto::storage::v1::MessageRecord;
use prost::Message as _;

use super::keys::{self, cf};
use super::mirror::{Mirror, Mirrors};
use super::{Op, Result, ScanDirection, Store, corrupt};

/// Rows a screen keeps after a trim; it trims at twice as many.
pub const SCREEN_ROWS: usize = 200;

/// The newest `messages` rows of one conversation.
#[derive(Debug, Default)]
pub struct Screen {
    /// Every row above this seq is here.
    lo: u64,
    /// The highest seq of a row put (or walked) so far.
    top: u64,
    rows: BTreeMap<u64, Arc<MessageRecord>>,
}

/// One op on a conversation's `messages` rows.
#[derive(Debug)]
pub enum Touch {
    Put(u64, Arc<MessageRecord>),
    Delete(u64),
    /// A row this screen cannot read: it no longer covers it.
    Unknown(u64),
}

/// Rows of a screen for one page, in the page's order.
pub struct Window {
    pub rows: Vec<(u64, Arc<MessageRecord>)>,
    /// Whether no row lies beyond the last of `rows` in the page's
    /// direction (above the page's lower bound).
    pub covered: bool,
    /// The screen's [`top`](Screen::top) then: a conversation whose latest
    /// seq is higher has a row the screen has not heard of yet.
    pub top: u64,
}

impl Screen {
    /// The rows a page beyond `from` in `direction`, above seq `above`,
    /// reads: at most `take`; `None` when a row it needs is not here.
    pub fn window(
        &self,
        from: u64,
        above: u64,
        direction: ScanDirection,
        take: usize,
    ) -> Option<Window> {
        let (rows, mut covered): (Vec<_>, bool) = match direction {
            ScanDirection::Forward => {
                let start = from.max(above);
                if self.lo > start {
                    return None;
                }
                let rows = self.rows.range(start.saturating_add(1)..);
                (rows.take(take + 1).map(clone_row).collect(), true)
            }
            ScanDirection::Backward => {
                let low = self.lo.max(above).saturating_add(1);
                if from <= low {
                    return (self.lo <= above).then_some(Window {
                        rows: Vec::new(),
                        covered: true,
                        top: self.top,
                    });
                }
                let rows = self.rows.range(low..from).rev();
                (
                    rows.take(take + 1).map(clone_row).collect(),
                    self.lo <= above,
                )
            }
        };
        let mut rows = rows;
        if rows.len() > take {
            rows.truncate(take);
            covered = false;
        }
        Some(Window {
            rows,
            covered,
            top: self.top,
        })
    }

    fn trim(&mut self) {
        if self.rows.len() <= 2 * SCREEN_ROWS {
            return;
        }
        while self.rows.len() > SCREEN_ROWS {
            if let Some((seq, _)) = self.rows.pop_first() {
                self.lo = seq;
            }
        }
    }

    /// Stops covering rows up to `seq`.
    fn drop_through(&mut self, seq: u64) {
        self.lo = self.lo.max(seq);
        self.rows = self.rows.split_off(&self.lo.saturating_add(1));
    }
}

fn clone_row((seq, record): (&u64, &Arc<MessageRecord>)) -> (u64, Arc<MessageRecord>) {
    (*seq, record.clone())
}

impl Mirror for Screen {
    type Touch = Touch;

    fn mirrors(name: &str) -> bool {
        name == cf::MESSAGES
    }

    fn touch(op: &Op) -> Option<Touch> {
        let key = match op {
            Op::Put(_, key, _) | Op::Delete(_, key) | Op::Merge(_, key, _) => key,
            Op::DeleteRange(..) => return None,
        };
        let seq = keys::last_u64(key)?;
        Some(match op {
            Op::Put(_, _, value) => match MessageRecord::decode(value.as_slice()) {
                Ok(record) => Touch::Put(seq, Arc::new(record)),
                Err(_) => Touch::Unknown(seq),
            },
            Op::Delete(..) => Touch::Delete(seq),
            _ => Touch::Unknown(seq),
        })
    }

    fn apply(&mut self, touch: &Touch) {
        match touch {
            Touch::Put(seq, record) if *seq > self.lo => {
                self.top = self.top.max(*seq);
                self.rows.insert(*seq, record.clone());
                self.trim();
            }
            Touch::Put(..) => {}
            Touch::Delete(seq) => {
                self.rows.remove(seq);
            }
            Touch::Unknown(seq) => self.drop_through(*seq),
        }
    }
}

/// The screens of one store.
pub(crate) type Screens = Mirrors<Screen>;

impl Store {
    /// Keeps `conversation`'s newest rows in memory from now on (a walk of
    /// them the first time), for [`scan_messages`](Self::scan_messages).
    pub fn keep_screen(&self, conversation: ConversationId) -> Result<()> {
        let screens = &self.views.screens;
        // Registered before the walk's iterator takes its snapshot.
        if let Some(build) = screens.begin(conversation) {
            let walked = self.walk_screen(conversation)?;
            build.finish(walked, true, |_| ());
        }
        Ok(())
    }

    /// The newest [`SCREEN_ROWS`] rows of `conversation`.
    fn walk_screen(&self, conversation: ConversationId) -> Result<Screen> {
        let bounds = (
            keys::message(conversation, Seq(0)).to_vec(),
            keys::message(conversation, Seq(u64::MAX)).to_vec(),
        );
        let mut it = self.bounded_iter(cf::MESSAGES, bounds);
        it.seek_to_last();
        let mut screen = Screen::default();
        while it.valid() {
            let (Some(key), Some(value)) = (it.key(), it.value()) else {
                break;
            };
            let seq = keys::last_u64(key).ok_or_else(|| corrupt(cf::MESSAGES, "short key"))?;
            if screen.rows.len() == SCREEN_ROWS {
                screen.lo = seq;
                break;
            }
            let record = MessageRecord::decode(value).map_err(|e| corrupt(cf::MESSAGES, e))?;
            screen.top = screen.top.max(seq);
            screen.rows.insert(seq, Arc::new(record));
            it.prev();
        }
        it.status()?;
        Ok(screen)
    }

    /// Whether `conversation`'s newest rows are kept (or being walked).
    pub fn has_screen(&self, conversation: ConversationId) -> bool {
        self.views.screens.has(conversation)
    }

    /// The screens kept now.
    pub fn screens_kept(&self) -> usize {
        self.views.screens.kept()
    }
}

#[cfg(test)]
mod tests {
    use cellmesh_proto::ids::UserId;
    use cellmesh_proto::storage::v1::ConversationSeq;
    use rand::{Rng, SeedableRng, rngs::StdRng};

    use super::super::testing::store;
    use super::super::{Mutation, ScanPage};
    use super::*;

    const C: ConversationId = ConversationId(42);
    const VIEWER: UserId = UserId(1);

    fn message(seq: u64, text: &str, directed: bool) -> MessageRecord {
        MessageRecord {
            sender_id: 3,
            body: format!("{text} {seq}").into_bytes(),
            visible_to: if directed { vec![2] } else { Vec::new() },
            ..Default::default()
        }
    }

    /// A send (the row and the latest seq in one batch), a rewrite of a
    /// recent row (a recall or edit), a delete-for-me, or tiering of the
    /// oldest rows; through the message lane, as the cell writes them.
    async fn random_change(store: &Store, rng: &mut StdRng, latest: &mut u64) {
        let mut m = Mutation::new();
        match rng.random_range(0..10) {
            0..=5 => {
                *latest += 1;
                m.put_message(C, *latest, &message(*latest, "sent", rng.random_bool(0.1)));
                let seq = ConversationSeq {
                    latest_seq: *latest,
                    ..Default::default()
                };
                m.put_conv_seq(C, &seq);
            }
            6 | 7 => {
                let seq = latest.saturating_sub(rng.random_range(0..300)).max(1);
                m.put_message(C, seq, &message(seq, "edited", false));
            }
            8 => m.hide(C, VIEWER, latest.saturating_sub(rng.random_range(0..100))),
            _ => {
                let through = latest.saturating_sub(500);
                let range = (
                    keys::message(C, Seq(1)).to_vec(),
                    keys::message(C, Seq(through + 1)).to_vec(),
                );
                m.ops.push(Op::DeleteRange(cf::MESSAGES, range.0, range.1));
            }
        }
        store.commit(m).await.unwrap();
    }

    fn same(a: &ScanPage, b: &ScanPage) -> bool {
        a.messages == b.messages && a.last_seq == b.last_seq && a.more == b.more
    }

    /// Pages a member pulls: the newest, older ones, newer than a cursor,
    /// small and large, for a viewer with delete-for-me rows and one
    /// without.
    fn compare_pages(store: &Store, latest: u64) -> usize {
        let mut from_screen = 0;
        let pages = [
            (latest + 1, ScanDirection::Backward, 50, 0),
            (latest + 1, ScanDirection::Backward, 1, 0),
            (latest.saturating_sub(40), ScanDirection::Backward, 20, 0),
            (latest.saturating_sub(500), ScanDirection::Backward, 50, 0),
            (latest.saturating_sub(30), ScanDirection::Forward, 50, 0),
            (latest.saturating_sub(5), ScanDirection::Forward, 3, 0),
            (
                latest + 1,
                ScanDirection::Backward,
                100,
                latest.saturating_sub(60),
            ),
            (0, ScanDirection::Forward, 10, 0),
        ];
        for viewer in [VIEWER, UserId(2)] {
            for (from, direction, limit, above) in pages {
                let before = crate::metrics::metrics().screen_pages.get();
                let page = store
                    .scan_messages(C, viewer, from, above, direction, limit, usize::MAX)
                    .unwrap();
                from_screen += (crate::metrics::metrics().screen_pages.get() - before) as usize;
                let stored = store
                    .scan_stored(C, viewer, from, above, direction, limit, usize::MAX)
                    .unwrap();
                assert!(
                    same(&page, &stored),
                    "from {from} {direction:?} limit {limit} above {above}"
                );
            }
        }
        from_screen
    }

    #[tokio::test]
    async fn a_kept_screen_pages_as_storage_does_through_every_change() {
        let (_dir, store) = store();
        let mut rng = StdRng::seed_from_u64(11);
        let mut latest = 0;
        for _ in 0..300 {
            random_change(&store, &mut rng, &mut latest).await;
        }
        store.keep_screen(C).unwrap();
        assert_eq!(store.screens_kept(), 1);
        let mut from_screen = 0;
        for round in 0..1_500 {
            random_change(&store, &mut rng, &mut latest).await;
            if round % 10 == 0 {
                // A range delete forgot it: kept again, as a pull does.
                store.keep_screen(C).unwrap();
                from_screen += compare_pages(&store, latest);
            }
        }
        assert!(
            from_screen > 500,
            "most pages came from the screen: {from_screen}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_screen_built_while_messages_are_written_misses_none() {
        let (_dir, store) = store();
        let writer = {
            let store = store.clone();
            tokio::spawn(async move {
                let mut rng = StdRng::seed_from_u64(5);
                let mut latest = 0;
                for _ in 0..3_000 {
                    random_change(&store, &mut rng, &mut latest).await;
                }
                latest
            })
        };
        let mut built = 0;
        while !writer.is_finished() {
            store.keep_screen(C).unwrap();
            built += 1;
            tokio::task::yield_now().await;
        }
        let latest = writer.await.unwrap();
        store.keep_screen(C).unwrap();
        assert!(built > 1);
        assert!(compare_pages(&store, latest) > 0);
    }

    #[test]
    fn a_row_it_cannot_read_is_no_longer_covered() {
        let mut screen = Screen::default();
        for seq in 1..=5 {
            screen.apply(&Touch::Put(seq, Arc::new(message(seq, "m", false))));
        }
        let window = screen.window(6, 0, ScanDirection::Backward, 10).unwrap();
        assert_eq!(window.rows.len(), 5);
        assert!(window.covered);
        screen.apply(&Touch::Unknown(3));
        let window = screen.window(6, 0, ScanDirection::Backward, 10).unwrap();
        assert_eq!(window.rows.len(), 2);
        assert!(!window.covered, "rows at and below 3 are read from storage");
        assert!(screen.window(2, 0, ScanDirection::Forward, 10).is_none());
    }

    #[test]
    fn it_keeps_the_newest_rows_when_it_grows() {
        let mut screen = Screen::default();
        for seq in 1..=(2 * SCREEN_ROWS as u64 + 1) {
            screen.apply(&Touch::Put(seq, Arc::new(message(seq, "m", false))));
        }
        assert_eq!(screen.rows.len(), SCREEN_ROWS);
        assert_eq!(screen.lo, SCREEN_ROWS as u64 + 1);
        // A row below what it covers is not taken.
        screen.apply(&Touch::Put(5, Arc::new(message(5, "m", false))));
        assert!(!screen.rows.contains_key(&5));
    }
}
