//! Paced sends for `bench group`: one send per tick, round-robin over
//! conversations, each in a task of its own, optionally only in the hot
//! halves of alternating [`Windows`]. The windows let one run measure the
//! same conversations with and without a load beside them in turns a few
//! seconds long, so that the machine's slow moments (a stalled fsync, a
//! busy neighbour on the host) fall on both sides alike instead of on one
//! phase.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use cellmesh_proto::ids::{ConversationId, TenantId, UserId};
use cellmesh_proto::v1::MessageType;
use hdrhistogram::Histogram;
use rand::Rng;

use crate::send::Client;
use crate::{count_error, histogram, send_request};

/// A sending pace: one send per `every` for `duration` (only in hot
/// windows, with `only`); times are µs since `epoch`.
#[derive(Clone, Copy)]
pub struct Pace {
    pub every: Duration,
    pub duration: Duration,
    pub epoch: Instant,
    pub only: Option<Windows>,
}

/// Alternating windows of `each` from `from_us` (µs since the epoch):
/// quiet, hot, quiet, hot...
#[derive(Clone, Copy)]
pub struct Windows {
    pub from_us: u64,
    pub each: Duration,
}

/// How long into a window a send counts as in it: a hot window's load
/// (hints pushed a slice at a time) outlasts its last send by this much
/// at most.
const SETTLE: Duration = Duration::from_millis(300);

impl Windows {
    /// Whether the window at `at_us` is hot.
    fn hot(&self, at_us: u64) -> bool {
        let each = self.each.as_micros() as u64;
        (at_us.saturating_sub(self.from_us) / each.max(1)) % 2 == 1
    }

    /// Which window `at_us` counts in: `Some(hot)`, or `None` while the
    /// window is settling.
    fn counted(&self, at_us: u64) -> Option<bool> {
        let each = self.each.as_micros() as u64;
        let into = at_us.saturating_sub(self.from_us) % each.max(1);
        (into >= SETTLE.as_micros() as u64).then(|| self.hot(at_us))
    }

    /// Latencies of `samples` (start µs, latency µs) in quiet windows and in
    /// hot ones.
    pub fn split(
        &self,
        samples: &[(u64, u64)],
    ) -> anyhow::Result<(Histogram<u64>, Histogram<u64>)> {
        let (mut quiet, mut hot) = (histogram(), histogram());
        for (at, took) in samples {
            match self.counted(*at) {
                Some(false) => quiet.record(*took)?,
                Some(true) => hot.record(*took)?,
                None => {}
            }
        }
        Ok((quiet, hot))
    }

    /// The median over windows of each window's `quantile` (ms), quiet
    /// windows and hot ones: a stall of the machine decides the p99 of
    /// the window it falls in, not of the whole run.
    pub fn median_of_windows(
        &self,
        samples: &[(u64, u64)],
        quantile: f64,
    ) -> anyhow::Result<(f64, f64)> {
        let each = (self.each.as_micros() as u64).max(1);
        let mut windows: BTreeMap<u64, Histogram<u64>> = BTreeMap::new();
        for (at, took) in samples {
            if self.counted(*at).is_some() {
                let window = at.saturating_sub(self.from_us) / each;
                windows
                    .entry(window)
                    .or_insert_with(histogram)
                    .record(*took)?;
            }
        }
        let median = |hot: u64| {
            let mut q: Vec<f64> = windows
                .iter()
                .filter(|(w, _)| *w % 2 == hot)
                .map(|(_, h)| crate::group::ms(h, quantile))
                .collect();
            q.sort_by(f64::total_cmp);
            match q.len() {
                0 => 0.0,
                n if n % 2 == 1 => q[n / 2],
                n => (q[n / 2 - 1] + q[n / 2]) / 2.0,
            }
        };
        Ok((median(0), median(1)))
    }
}

/// What paced sends saw.
pub struct Sent {
    /// Ack latency (µs).
    pub latency: Histogram<u64>,
    /// Each acked seq's send start (µs since the epoch).
    pub starts: HashMap<u64, u64>,
    /// (start µs, latency µs) of each acked send.
    pub samples: Vec<(u64, u64)>,
    /// Errors by code.
    pub errors: BTreeMap<String, u64>,
}

/// Sends at `pace`, round-robin over (conversation, sender), each in its
/// own task (a slow answer does not hold the next send back).
pub async fn send_paced(
    client: &Client,
    tenant: TenantId,
    into: &[(ConversationId, UserId)],
    pace: Pace,
) -> anyhow::Result<Sent> {
    let mut sent = Sent {
        latency: histogram(),
        starts: HashMap::new(),
        samples: Vec::new(),
        errors: BTreeMap::new(),
    };
    let run = rand::rng().random::<u32>();
    let mut tick = tokio::time::interval(pace.every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let deadline = Instant::now() + pace.duration;
    let epoch = pace.epoch;
    let mut inflight = tokio::task::JoinSet::new();
    let mut n = 0usize;
    while Instant::now() < deadline {
        tick.tick().await;
        let now_us = epoch.elapsed().as_micros() as u64;
        if pace.only.is_some_and(|w| !w.hot(now_us)) {
            continue;
        }
        let (conv, user) = into[n % into.len()];
        n += 1;
        let mut c = client.clone();
        let req = send_request(
            tenant.get(),
            user.get(),
            conv.get(),
            format!("b{run}-{n}"),
            MessageType::Text,
            b"x".to_vec(),
        );
        inflight.spawn(async move {
            let at = Instant::now();
            let answer = c.send(req).await.map(|r| r.into_inner().seq);
            let took = at.elapsed().as_micros() as u64;
            (took, at.duration_since(epoch).as_micros() as u64, answer)
        });
        while let Some(done) = inflight.try_join_next() {
            sent.record(done?);
        }
    }
    while let Some(done) = inflight.join_next().await {
        sent.record(done?);
    }
    Ok(sent)
}

impl Sent {
    fn record(&mut self, (took, at_us, answer): (u64, u64, Result<u64, tonic::Status>)) {
        match answer {
            Ok(seq) => {
                let took = took.max(1);
                let _ = self.latency.record(took);
                self.starts.insert(seq, at_us);
                self.samples.push((at_us, took));
            }
            Err(status) => count_error(&mut self.errors, &status),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_count_in_their_window_once_it_has_settled() {
        let w = Windows {
            from_us: 1_000_000,
            each: Duration::from_secs(2),
        };
        let settle = SETTLE.as_micros() as u64;
        let samples = [
            (1_000_000 + settle, 10),     // quiet
            (3_000_000 + 5, 99),          // hot, settling
            (3_000_000 + settle, 20),     // hot
            (4_999_999, 30),              // hot
            (5_000_000 + settle - 1, 99), // quiet, settling
            (7_500_000, 40),              // hot
        ];
        let (quiet, hot) = w.split(&samples).unwrap();
        assert_eq!((quiet.len(), quiet.max()), (1, 10));
        assert_eq!((hot.len(), hot.min(), hot.max()), (3, 20, 40));
        assert!(!w.hot(0) && !w.hot(2_999_999) && w.hot(3_000_000));
    }

    #[test]
    fn one_stalled_window_does_not_decide_the_median_of_the_windows() {
        let w = Windows {
            from_us: 0,
            each: Duration::from_secs(1),
        };
        let settle = SETTLE.as_micros() as u64;
        let mut samples = Vec::new();
        // Windows 0..6: quiet ones answer in 1 ms, hot ones in 2 ms, and
        // quiet window 2 holds one stall of 500 ms.
        for window in 0..6u64 {
            for i in 0..100 {
                let took = if window % 2 == 1 { 2_000 } else { 1_000 };
                samples.push((window * 1_000_000 + settle + i * 1_000, took));
            }
        }
        samples.push((2_000_000 + settle + 500_000, 500_000));
        // A settling sample counts nowhere.
        samples.push((4_000_000 + 1, 900_000));
        let (quiet, hot) = w.median_of_windows(&samples, 1.0).unwrap();
        assert!((quiet - 1.0).abs() < 0.01, "{quiet}");
        assert!((hot - 2.0).abs() < 0.01, "{hot}");
        let (all_quiet, _) = w.split(&samples).unwrap();
        assert_eq!(all_quiet.max() / 1000, 500);
    }
}
