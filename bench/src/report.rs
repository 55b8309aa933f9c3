//! What a benchmark measured, printed for a person and written as JSON.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

#[derive(Debug, Serialize)]
pub struct Report {
    pub scenario: String,
    pub acked: u64,
    pub errors: u64,
    /// Error counts by stable code.
    pub errors_by_code: BTreeMap<String, u64>,
    pub duration_s: f64,
    pub throughput_per_s: f64,
    pub latency_ms: Latency,
    /// Scenario parameters, for reproducing the run.
    pub params: BTreeMap<String, serde_json::Value>,
}

#[derive(Debug, Serialize)]
pub struct Latency {
    pub p50: f64,
    pub p90: f64,
    pub p95: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
    pub mean: f64,
}

impl Latency {
    /// From a histogram of microseconds.
    pub fn from_micros(h: &Histogram<u64>) -> Self {
        let ms = |v: u64| v as f64 / 1000.0;
        Self {
            p50: ms(h.value_at_quantile(0.50)),
            p90: ms(h.value_at_quantile(0.90)),
            p95: ms(h.value_at_quantile(0.95)),
            p99: ms(h.value_at_quantile(0.99)),
            p999: ms(h.value_at_quantile(0.999)),
            max: ms(h.max()),
            mean: h.mean() / 1000.0,
        }
    }
}

impl Report {
    pub fn new(
        scenario: &str,
        acked: u64,
        errors_by_code: BTreeMap<String, u64>,
        elapsed: Duration,
        latency_us: &Histogram<u64>,
    ) -> Self {
        let duration_s = elapsed.as_secs_f64();
        Self {
            scenario: scenario.to_string(),
            acked,
            errors: errors_by_code.values().sum(),
            errors_by_code,
            duration_s,
            throughput_per_s: if duration_s > 0.0 {
                acked as f64 / duration_s
            } else {
                0.0
            },
            latency_ms: Latency::from_micros(latency_us),
            params: BTreeMap::new(),
        }
    }

    /// Adds this run's throughput as a share of the ceiling that
    /// `bench storage` wrote to `ceiling` (its JSON), when one is named.
    pub fn against_ceiling(self, ceiling: Option<&Path>) -> anyhow::Result<Self> {
        let Some(path) = ceiling else {
            return Ok(self);
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("cannot read the ceiling {}: {e}", path.display()))?;
        let json: serde_json::Value = serde_json::from_str(&text)?;
        let top = json["throughput_per_s"]
            .as_f64()
            .filter(|t| *t > 0.0)
            .ok_or_else(|| anyhow::anyhow!("{} has no throughput_per_s", path.display()))?;
        let share = self.throughput_per_s / top;
        println!(
            "ceiling       {top:.0} /s (bench storage); this run is {:.0}% of it",
            share * 100.0
        );
        Ok(self
            .param("ceiling_per_s", top)
            .param("share_of_ceiling", share))
    }

    pub fn param(mut self, key: &str, value: impl Into<serde_json::Value>) -> Self {
        self.params.insert(key.to_string(), value.into());
        self
    }

    pub fn print(&self) {
        println!("scenario      {}", self.scenario);
        for (k, v) in &self.params {
            println!("  {k:<19} {v}");
        }
        println!("acked         {} in {:.1} s", self.acked, self.duration_s);
        println!("throughput    {:.0} /s", self.throughput_per_s);
        let l = &self.latency_ms;
        println!(
            "latency ms    p50 {:.2}  p90 {:.2}  p99 {:.2}  p999 {:.2}  max {:.2}",
            l.p50, l.p90, l.p99, l.p999, l.max
        );
        println!("errors        {} {:?}", self.errors, self.errors_by_code);
    }

    pub fn write_json(&self, path: &Path) -> anyhow::Result<()> {
        std::fs::write(path, serde_json::to_string_pretty(self)? + "\n")?;
        Ok(())
    }
}
