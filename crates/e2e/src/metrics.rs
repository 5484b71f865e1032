//! A service's `/metrics`, scraped and summed the way a Prometheus query would.
//!
//! The text format is read here rather than by a parser crate: the one on crates.io
//! (`prometheus-parse` 0.2) drops every sample whose label value holds a `}`, which each
//! route pattern with a parameter (`/v1/orders/{id}`) does.

use std::collections::HashMap;

/// One scrape of one instance: its samples, each a name, labels and a value.
pub struct Metrics {
    samples: Vec<(String, HashMap<String, String>, f64)>,
}

impl Metrics {
    /// Parses Prometheus text (format 0.0.4); panics, naming the line, on text that is not.
    pub fn parse(text: &str) -> Self {
        let samples = text
            .lines()
            .filter(|line| !line.is_empty() && !line.starts_with('#'))
            .map(|line| sample(line).unwrap_or_else(|| panic!("not a sample: {line:?}")))
            .collect();
        Self { samples }
    }

    /// The sum of `name` over every series whose labels include `labels`, as
    /// `sum(name{labels})` would be; 0 if there is none. For a histogram, name its
    /// `_count` (or `_sum`, `_bucket`).
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.samples
            .iter()
            .filter(|(metric, have, _)| {
                metric == name
                    && labels
                        .iter()
                        .all(|(key, value)| have.get(*key).map(String::as_str) == Some(*value))
            })
            .map(|(_, _, value)| value)
            .sum()
    }

    /// [`sum`](Self::sum) as a whole number, for counters.
    pub fn count(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        let sum = self.sum(name, labels);
        assert!(
            sum >= 0.0 && sum.fract() == 0.0,
            "{name}: {sum} is no count"
        );
        sum as u64
    }

    /// How many observations histogram `name` holds in the series matching `labels`.
    pub fn observations(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.count(&format!("{name}_count"), labels)
    }

    /// Every value label `label` takes on `name`'s series.
    pub fn label_values(&self, name: &str, label: &str) -> Vec<String> {
        let mut values: Vec<String> = self
            .samples
            .iter()
            .filter(|(metric, _, _)| metric == name)
            .filter_map(|(_, labels, _)| labels.get(label).cloned())
            .collect();
        values.sort();
        values.dedup();
        values
    }
}

/// `name{key="value",...} 12.5`, label values with `\\`, `\"` and `\n` escaped.
fn sample(line: &str) -> Option<(String, HashMap<String, String>, f64)> {
    let name_end = line.find(['{', ' '])?;
    let (name, mut rest) = line.split_at(name_end);
    let mut labels = HashMap::new();
    if let Some(after) = rest.strip_prefix('{') {
        rest = after;
        loop {
            if let Some(after) = rest.strip_prefix('}') {
                rest = after;
                break;
            }
            let (key, after) = rest.split_once("=\"")?;
            let mut value = String::new();
            let mut chars = after.char_indices();
            let end = loop {
                match chars.next()? {
                    (i, '"') => break i,
                    (_, '\\') => match chars.next()?.1 {
                        'n' => value.push('\n'),
                        other => value.push(other),
                    },
                    (_, c) => value.push(c),
                }
            };
            labels.insert(key.to_owned(), value);
            rest = &after[end + 1..];
            rest = rest.strip_prefix(',').unwrap_or(rest);
        }
    }
    let value = rest.split_whitespace().next()?.parse().ok()?;
    Some((name.to_owned(), labels, value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_label_value_may_hold_braces_quotes_and_commas() {
        let metrics = Metrics::parse(
            "# TYPE r counter\n\
             r{route=\"/v1/orders/{id}\",status=\"200\"} 3\n\
             r{route=\"a\\\"b,c}\",status=\"200\"} 4\n\
             h_bucket{le=\"+Inf\"} 7\n\
             plain 1.5\n",
        );
        assert_eq!(metrics.count("r", &[("route", "/v1/orders/{id}")]), 3);
        assert_eq!(metrics.count("r", &[("route", "a\"b,c}")]), 4);
        assert_eq!(metrics.count("r", &[("status", "200")]), 7);
        assert_eq!(metrics.sum("h_bucket", &[("le", "+Inf")]), 7.0);
        assert_eq!(metrics.sum("plain", &[]), 1.5);
        assert_eq!(metrics.sum("absent", &[]), 0.0);
    }
}
