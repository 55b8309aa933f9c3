//! Message (and conversation) ids: 63-bit, time-ordered and never reused.
//! Layout, high to low: 41 bits of milliseconds since 2024-01-01, 10 bits of
//! cell instance id, 12 bits of counter within the millisecond.
//!
//! Ids stay increasing when the clock steps back (the generator keeps using
//! the last millisecond it issued) and across restarts: the generator only
//! issues ids up to a reserved time that the caller persists first
//! ([`IdGenerator::next`] answers [`Next::Reserve`] when it needs more).

use std::sync::Mutex;

/// 2024-01-01T00:00:00Z in Unix milliseconds.
pub const ID_EPOCH_MS: u64 = 1_704_067_200_000;
const INSTANCE_BITS: u32 = 10;
const COUNTER_BITS: u32 = 12;
const MAX_COUNTER: u64 = (1 << COUNTER_BITS) - 1;

pub struct IdGenerator {
    instance: u64,
    state: Mutex<State>,
}

struct State {
    last_ms: u64,
    counter: u64,
    reserved_until_ms: u64,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    Id(u64),
    /// Persist a reservation up to at least this time, then call
    /// [`IdGenerator::extend_reservation`] and ask again.
    Reserve(u64),
}

impl IdGenerator {
    /// `reserved_until_ms` is the reservation persisted by the previous run:
    /// ids of this run start after it.
    pub fn new(instance: u16, reserved_until_ms: u64) -> Self {
        Self {
            instance: u64::from(instance) & ((1 << INSTANCE_BITS) - 1),
            state: Mutex::new(State {
                last_ms: reserved_until_ms,
                counter: MAX_COUNTER,
                reserved_until_ms,
            }),
        }
    }

    pub fn next(&self, now_ms: u64) -> Next {
        let mut s = self.state.lock().expect("id generator lock");
        let mut ms = now_ms.max(s.last_ms);
        let mut counter = 0;
        if ms == s.last_ms {
            if s.counter == MAX_COUNTER {
                ms += 1;
            } else {
                counter = s.counter + 1;
            }
        }
        if ms >= s.reserved_until_ms {
            return Next::Reserve(ms);
        }
        s.last_ms = ms;
        s.counter = counter;
        let elapsed = ms.saturating_sub(ID_EPOCH_MS);
        Next::Id(
            elapsed << (INSTANCE_BITS + COUNTER_BITS) | self.instance << COUNTER_BITS | counter,
        )
    }

    pub fn extend_reservation(&self, until_ms: u64) {
        let mut s = self.state.lock().expect("id generator lock");
        s.reserved_until_ms = s.reserved_until_ms.max(until_ms);
    }
}

/// The Unix-ms time an id was issued at.
pub fn id_time_ms(id: u64) -> u64 {
    (id >> (INSTANCE_BITS + COUNTER_BITS)) + ID_EPOCH_MS
}

#[cfg(test)]
mod tests {
    use super::*;

    fn take(g: &IdGenerator, now: u64) -> u64 {
        loop {
            match g.next(now) {
                Next::Id(id) => return id,
                Next::Reserve(ms) => g.extend_reservation(ms + 10_000),
            }
        }
    }

    #[test]
    fn ids_increase_within_a_millisecond_and_across_clock_steps_back() {
        let now = ID_EPOCH_MS + 1_000_000;
        let g = IdGenerator::new(7, now - 5);
        let mut last = 0;
        for i in 0..10_000u64 {
            // The clock wanders backwards every few calls.
            let t = now + i / 100 - (i % 7);
            let id = take(&g, t);
            assert!(id > last, "id {id} after {last}");
            last = id;
        }
    }

    #[test]
    fn no_id_is_issued_beyond_the_reservation() {
        let now = ID_EPOCH_MS + 50_000;
        let g = IdGenerator::new(1, now);
        // Ids of this run start after the previous run's reservation.
        assert_eq!(g.next(now), Next::Reserve(now + 1));
        g.extend_reservation(now + 10);
        let id = take(&g, now);
        assert!(id_time_ms(id) >= now && id_time_ms(id) < now + 10);
    }

    #[test]
    fn a_restart_with_the_clock_behind_still_issues_higher_ids() {
        let now = ID_EPOCH_MS + 90_000;
        let g = IdGenerator::new(3, now);
        g.extend_reservation(now + 10_000);
        let before = take(&g, now + 500);
        // Restart: the persisted reservation was now + 10_000; the clock is
        // an hour behind.
        let g2 = IdGenerator::new(3, now + 10_000);
        let after = take(&g2, now - 3_600_000);
        assert!(after > before);
    }

    #[test]
    fn instance_bits_separate_cells() {
        let now = ID_EPOCH_MS + 1_000;
        let a = IdGenerator::new(1, 0);
        let b = IdGenerator::new(2, 0);
        assert_ne!(take(&a, now), take(&b, now));
    }
}
