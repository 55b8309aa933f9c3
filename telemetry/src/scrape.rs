//! Reading another process's `/metrics`: fetch the Prometheus text over
//! HTTP, parse its samples, and read counters, gauges and histogram
//! quantiles out of them (the console's per-cell panels are computed this
//! way, from the same series Prometheus scrapes).

use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// One sample: metric name, labels, value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

/// The samples of one scrape.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Samples(pub Vec<Sample>);

impl Samples {
    /// Parses Prometheus or OpenMetrics text; lines it cannot read are
    /// skipped.
    pub fn parse(text: &str) -> Self {
        Self(
            text.lines()
                .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
                .filter_map(parse_line)
                .collect(),
        )
    }

    fn matching<'a>(
        &'a self,
        name: &'a str,
        filter: &'a [(&'a str, &'a str)],
    ) -> impl Iterator<Item = &'a Sample> {
        self.0.iter().filter(move |s| {
            s.name == name
                && filter
                    .iter()
                    .all(|(k, v)| s.labels.iter().any(|(lk, lv)| lk == k && lv == v))
        })
    }

    /// The sum of `name`'s samples whose labels include `filter`.
    pub fn sum(&self, name: &str, filter: &[(&str, &str)]) -> f64 {
        self.matching(name, filter).map(|s| s.value).sum()
    }

    /// The cumulative buckets `(le, count)` of histogram `name` (its
    /// `_bucket` series, summed over the series matching `filter`), by
    /// upper bound.
    pub fn buckets(&self, name: &str, filter: &[(&str, &str)]) -> Vec<(f64, f64)> {
        let series = format!("{name}_bucket");
        let mut by_le: Vec<(f64, f64)> = Vec::new();
        for s in self.matching(&series, filter) {
            let Some(le) = s
                .labels
                .iter()
                .find(|(k, _)| k == "le")
                .and_then(|(_, v)| parse_value(v))
            else {
                continue;
            };
            match by_le.iter_mut().find(|(b, _)| *b == le) {
                Some((_, count)) => *count += s.value,
                None => by_le.push((le, s.value)),
            }
        }
        by_le.sort_by(|a, b| a.0.total_cmp(&b.0));
        by_le
    }
}

/// The `q` quantile of what was observed between two scrapes of a
/// histogram (`before`, `after`: cumulative buckets), interpolated within
/// the bucket as Prometheus's `histogram_quantile` does. `None` when
/// nothing was observed in between.
pub fn quantile_between(q: f64, before: &[(f64, f64)], after: &[(f64, f64)]) -> Option<f64> {
    let deltas: Vec<(f64, f64)> = after
        .iter()
        .map(|(le, count)| {
            let earlier = before
                .iter()
                .find(|(b, _)| b == le)
                .map_or(0.0, |(_, c)| *c);
            (*le, (count - earlier).max(0.0))
        })
        .collect();
    quantile(q, &deltas)
}

/// The `q` quantile of cumulative buckets.
pub fn quantile(q: f64, buckets: &[(f64, f64)]) -> Option<f64> {
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let mut lower = (0.0, 0.0);
    for (le, count) in buckets {
        if *count >= rank {
            if le.is_infinite() {
                // Above the highest finite bound: report that bound.
                return Some(lower.0);
            }
            let in_bucket = count - lower.1;
            let fraction = if in_bucket > 0.0 {
                (rank - lower.1) / in_bucket
            } else {
                1.0
            };
            return Some(lower.0 + (le - lower.0) * fraction);
        }
        lower = (*le, *count);
    }
    Some(lower.0)
}

fn parse_value(text: &str) -> Option<f64> {
    match text {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        other => other.parse().ok(),
    }
}

fn parse_line(line: &str) -> Option<Sample> {
    let (name, rest) = match line.find(['{', ' ']) {
        Some(i) => line.split_at(i),
        None => return None,
    };
    let mut labels = Vec::new();
    let rest = if let Some(body) = rest.strip_prefix('{') {
        let mut chars = body.char_indices().peekable();
        let mut end = None;
        loop {
            // key="value" pairs separated by ',' up to '}'.
            while chars.peek().is_some_and(|(_, c)| *c == ',' || *c == ' ') {
                chars.next();
            }
            match chars.peek() {
                Some((i, '}')) => {
                    end = Some(*i);
                    break;
                }
                None => break,
                _ => {}
            }
            let mut key = String::new();
            for (_, c) in chars.by_ref() {
                if c == '=' {
                    break;
                }
                key.push(c);
            }
            if chars.next().map(|(_, c)| c) != Some('"') {
                return None;
            }
            let mut value = String::new();
            let mut escaped = false;
            for (_, c) in chars.by_ref() {
                match (escaped, c) {
                    (true, 'n') => (value.push('\n'), escaped = false).1,
                    (true, c) => (value.push(c), escaped = false).1,
                    (false, '\\') => escaped = true,
                    (false, '"') => break,
                    (false, c) => value.push(c),
                }
            }
            labels.push((key.trim().to_string(), value));
        }
        &body[end? + 1..]
    } else {
        rest
    };
    let value = parse_value(rest.split_whitespace().next()?)?;
    Some(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

/// `GET url` (plain HTTP) within `timeout`: the body of a 200 answer.
pub async fn fetch(url: &str, timeout: Duration) -> Result<String, String> {
    let uri: hyper::Uri = url.parse().map_err(|e| format!("{url}: {e}"))?;
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let answer = tokio::time::timeout(timeout, async {
        let response = client.get(uri).await.map_err(|e| e.to_string())?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        if !status.is_success() {
            return Err(format!("HTTP {status}"));
        }
        String::from_utf8(body.to_vec()).map_err(|e| e.to_string())
    })
    .await
    .map_err(|_| format!("{url}: no answer within {timeout:?}"))?;
    answer.map_err(|e| format!("{url}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# HELP x_seconds Time.
# TYPE x_seconds histogram
x_seconds_bucket{method="a",le="0.1"} 50
x_seconds_bucket{method="a",le="0.2"} 90
x_seconds_bucket{method="a",le="+Inf"} 100
x_seconds_bucket{method="b",le="0.1"} 7
x_seconds_bucket{method="b",le="0.2"} 7
x_seconds_bucket{method="b",le="+Inf"} 7
sends_total{code="OK",reason=""} 12
sends_total{code="UNAVAILABLE",reason="say \"hi\", then"} 3
plain 4.5
"#;

    #[test]
    fn parses_samples_and_labels() {
        let s = Samples::parse(TEXT);
        assert_eq!(s.sum("sends_total", &[]), 15.0);
        assert_eq!(s.sum("sends_total", &[("code", "OK")]), 12.0);
        assert_eq!(s.sum("plain", &[]), 4.5);
        let odd = s.0.iter().find(|x| x.value == 3.0).unwrap();
        assert_eq!(odd.labels[1].1, "say \"hi\", then");
        assert_eq!(
            s.buckets("x_seconds", &[("method", "a")]),
            vec![(0.1, 50.0), (0.2, 90.0), (f64::INFINITY, 100.0)]
        );
        assert_eq!(
            s.buckets("x_seconds", &[]).last(),
            Some(&(f64::INFINITY, 107.0))
        );
    }

    #[test]
    fn quantiles_interpolate_like_prometheus() {
        let after = [(0.1, 50.0), (0.2, 90.0), (f64::INFINITY, 100.0)];
        // The median is the top of the first bucket.
        assert_eq!(quantile(0.5, &after), Some(0.1));
        // 0.7 × 100 = 70: half-way through the (0.1, 0.2] bucket.
        assert!((quantile(0.7, &after).unwrap() - 0.15).abs() < 1e-9);
        // Beyond the last finite bound.
        assert_eq!(quantile(0.99, &after), Some(0.2));
        let before = [(0.1, 50.0), (0.2, 50.0), (f64::INFINITY, 50.0)];
        // Between the scrapes: 40 in (0.1, 0.2], 10 above.
        assert!((quantile_between(0.5, &before, &after).unwrap() - 0.1625).abs() < 1e-9);
        assert_eq!(quantile_between(0.5, &after, &after), None);
    }
}
