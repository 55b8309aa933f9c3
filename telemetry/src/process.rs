//! The process's own resources, read from `/proc` at each scrape under the
//! standard names (`process_cpu_seconds_total`,
//! `process_resident_memory_bytes`, `process_open_fds`, …), and the build
//! it runs (`cellmesh_build_info{version}`, always 1), so an operator sees
//! which processes a rolling upgrade has reached. Elsewhere than Linux only
//! the build is reported.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

#[derive(Debug)]
pub struct ProcessCollector;

/// What `/proc/self` says, in base units.
#[derive(Debug, Default, PartialEq)]
pub struct ProcessStats {
    pub cpu_seconds: f64,
    pub resident_bytes: f64,
    pub virtual_bytes: f64,
    pub start_time_seconds: f64,
    pub threads: f64,
    pub open_fds: f64,
}

impl ProcessStats {
    /// Reads this process's figures (`None` where `/proc` is missing).
    pub fn read() -> Option<Self> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        let boot = std::fs::read_to_string("/proc/stat").ok()?;
        let boot_time = boot
            .lines()
            .find_map(|l| l.strip_prefix("btime "))
            .and_then(|v| v.trim().parse::<f64>().ok())?;
        let open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as f64;
        // SAFETY: sysconf only reads system constants.
        let (ticks, page) = unsafe {
            (
                libc::sysconf(libc::_SC_CLK_TCK) as f64,
                libc::sysconf(libc::_SC_PAGESIZE) as f64,
            )
        };
        Self::parse(&stat, boot_time, ticks, page, open_fds)
    }

    /// Parses `/proc/self/stat` (fields after the parenthesised command).
    pub fn parse(stat: &str, boot_time: f64, ticks: f64, page: f64, open_fds: f64) -> Option<Self> {
        let rest = &stat[stat.rfind(')')? + 2..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // Field numbers of proc(5) minus 3 (pid, comm and state are gone).
        let num = |n: usize| fields.get(n - 3)?.parse::<f64>().ok();
        Some(Self {
            cpu_seconds: (num(14)? + num(15)?) / ticks,
            threads: num(20)?,
            start_time_seconds: boot_time + num(22)? / ticks,
            virtual_bytes: num(23)?,
            resident_bytes: num(24)? * page,
            open_fds,
        })
    }
}

/// The release this binary was built as.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let build = ConstGauge::new(1i64);
        let mut family = encoder.encode_descriptor(
            "cellmesh_build_info",
            "The release this process runs (always 1).",
            None,
            build.metric_type(),
        )?;
        build.encode(family.encode_family(&[("version", VERSION)])?)?;
        let Some(stats) = ProcessStats::read() else {
            return Ok(());
        };
        let cpu = ConstCounter::new(stats.cpu_seconds);
        cpu.encode(encoder.encode_descriptor(
            "process_cpu_seconds",
            "User and system CPU time spent, in seconds.",
            None,
            cpu.metric_type(),
        )?)?;
        let gauges = [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                stats.resident_bytes,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes.",
                stats.virtual_bytes,
            ),
            (
                "process_start_time_seconds",
                "Start time of the process since the Unix epoch, in seconds.",
                stats.start_time_seconds,
            ),
            (
                "process_open_fds",
                "Number of open file descriptors.",
                stats.open_fds,
            ),
            (
                "process_threads",
                "Number of OS threads in the process.",
                stats.threads,
            ),
        ];
        for (name, help, value) in gauges {
            let gauge = ConstGauge::new(value);
            gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_stat_with_spaces_in_the_command() {
        let stat = "4242 (cell (x) y) S 1 4242 4242 0 -1 4194560 500 0 0 0 250 50 0 0 20 0 7 0 1000 104857600 2560 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
        let stats = ProcessStats::parse(stat, 1_700_000_000.0, 100.0, 4096.0, 12.0).unwrap();
        assert_eq!(stats.cpu_seconds, 3.0);
        assert_eq!(stats.threads, 7.0);
        assert_eq!(stats.start_time_seconds, 1_700_000_010.0);
        assert_eq!(stats.virtual_bytes, 104_857_600.0);
        assert_eq!(stats.resident_bytes, 2560.0 * 4096.0);
        assert!(ProcessStats::parse("garbage", 0.0, 100.0, 4096.0, 0.0).is_none());
    }

    #[test]
    fn reads_this_process() {
        let stats = ProcessStats::read().unwrap();
        assert!(stats.resident_bytes > 0.0 && stats.threads >= 1.0 && stats.open_fds >= 1.0);
    }
}
