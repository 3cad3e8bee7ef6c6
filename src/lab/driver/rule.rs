//! The small declared rules that read a product's answers: its view of each
//! backend (status by backend) and its counters, from CSV rows, a JSON document or
//! Prometheus' text format.

use super::file::{CsvRule, JsonRule, LogRule, PromRule};

/// `(backend key, status)` from the JSON lines of a log that have both members.
pub fn log_statuses(rule: &LogRule, text: &str) -> Vec<(String, String)> {
    let word = |v: &serde_json::Value| match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    text.lines()
        .filter_map(|line| {
            let doc: serde_json::Value = serde_json::from_str(line).ok()?;
            Some((
                word(doc.pointer(&rule.key)?),
                word(doc.pointer(&rule.status)?),
            ))
        })
        .collect()
}

/// `(backend key, status word)` pairs from a CSV answer.
pub fn csv_statuses(rule: &CsvRule, text: &str) -> Vec<(String, String)> {
    csv_backends(rule, text)
        .filter_map(|(id, fields)| Some((id.to_string(), fields.get(rule.status)?.to_string())))
        .collect()
}

/// `(backend key, requests served)` pairs: `rule.requests`' fields summed per row.
pub fn csv_requests(rule: &CsvRule, text: &str) -> Vec<(String, u64)> {
    csv_backends(rule, text)
        .map(|(id, fields)| (id.to_string(), sum(&rule.requests, &fields)))
        .collect()
}

/// The sum of `rule.sum`'s fields over the matching rows.
pub fn csv_count(rule: &CsvRule, text: &str) -> u64 {
    csv_rows(rule, text)
        .map(|fields| sum(&rule.sum, &fields))
        .sum()
}

/// The fields of each row `rule.rows` picks.
fn csv_rows<'t>(rule: &CsvRule, text: &'t str) -> impl Iterator<Item = Vec<&'t str>> {
    text.lines()
        .filter(|l| l.starts_with(&rule.rows))
        .map(|l| l.split(',').collect())
}

/// The picked rows that name a backend not skipped: its key and the row's fields.
fn csv_backends<'t>(
    rule: &CsvRule,
    text: &'t str,
) -> impl Iterator<Item = (&'t str, Vec<&'t str>)> {
    csv_rows(rule, text).filter_map(|fields| {
        let id = *fields.get(rule.id)?;
        (!rule.skip.iter().any(|s| s == id)).then_some((id, fields))
    })
}

/// The numbers in `fields` at `at`, summed; a field missing or not a number counts 0.
fn sum(at: &[usize], fields: &[&str]) -> u64 {
    at.iter()
        .filter_map(|&i| fields.get(i)?.trim().parse::<u64>().ok())
        .sum()
}

/// `(backend key, status)` pairs from a JSON answer: an object of status by key at
/// `rule.at`, or an array of objects with the key and status as members.
pub fn json_statuses(rule: &JsonRule, text: &str) -> Result<Vec<(String, String)>, String> {
    let doc: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let at = doc
        .pointer(&rule.at)
        .ok_or_else(|| format!("nothing at {:?}", rule.at))?;
    let word = |v: &serde_json::Value| match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    match (at, &rule.id, &rule.status) {
        (serde_json::Value::Object(map), _, _) => {
            Ok(map.iter().map(|(k, v)| (k.clone(), word(v))).collect())
        }
        (serde_json::Value::Array(items), Some(id), Some(status)) => Ok(items
            .iter()
            .filter_map(|item| Some((word(item.get(id)?), word(item.get(status)?))))
            .collect()),
        (serde_json::Value::Array(_), _, _) => {
            Err("an array needs `id` and `status` in the json rule".into())
        }
        _ => Err(format!("{:?} is neither an object nor an array", rule.at)),
    }
}

/// The series of `metric`: its labels and value.
fn prom_series<'a>(
    metric: &str,
    text: &'a str,
) -> impl Iterator<Item = (Vec<(String, String)>, f64)> + 'a {
    let metric = metric.to_string();
    text.lines().filter_map(move |line| {
        let line = line.trim();
        if line.starts_with('#') {
            return None;
        }
        let name_end = line.find(['{', ' '])?;
        if line[..name_end] != metric {
            return None;
        }
        let (labels, rest) = if line[name_end..].starts_with('{') {
            let close = line.rfind('}')?;
            (parse_labels(&line[name_end + 1..close]), &line[close + 1..])
        } else {
            (Vec::new(), &line[name_end..])
        };
        let value = rest.split_whitespace().next()?.parse::<f64>().ok()?;
        Some((labels, value))
    })
}

/// `a="x",b="y\"z"` → pairs.
fn parse_labels(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut chars = text.chars().peekable();
    loop {
        let name: String = chars
            .by_ref()
            .skip_while(|c| *c == ',' || c.is_whitespace())
            .take_while(|c| *c != '=')
            .collect();
        if name.is_empty() || chars.next() != Some('"') {
            return out;
        }
        let mut value = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => value.extend(chars.next()),
                '"' => break,
                c => value.push(c),
            }
        }
        out.push((name.trim().to_string(), value));
    }
}

/// `(backend key, value)` from the series of `rule.metric` by `rule.label`.
pub fn prom_statuses(rule: &PromRule, text: &str) -> Vec<(String, String)> {
    let Some(label) = &rule.label else {
        return Vec::new();
    };
    prom_series(&rule.metric, text)
        .filter_map(|(labels, value)| {
            let key = labels.into_iter().find(|(n, _)| n == label)?.1;
            Some((key, format!("{value}")))
        })
        .collect()
}

/// The sum of every series of `rule.metric`.
pub fn prom_count(rule: &PromRule, text: &str) -> u64 {
    prom_series(&rule.metric, text)
        .map(|(_, v)| v)
        .sum::<f64>()
        .max(0.0) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_rows_by_prefix_with_skips_and_sums() {
        let text = "# pxname,svname,a,b\nbe,a,1,2\nbe,b,3,x\nbe,BACKEND,5,6\nfe,FRONTEND,7,8\n";
        let rule = CsvRule {
            rows: "be,".into(),
            id: 1,
            status: 2,
            skip: vec!["BACKEND".into()],
            sum: vec![2, 3],
            requests: vec![2, 3],
        };
        assert_eq!(
            csv_statuses(&rule, text),
            [("a".into(), "1".into()), ("b".into(), "3".into())]
        );
        // Unparsable fields count nothing: 1+2 + 3 + 5+6.
        assert_eq!(csv_count(&rule, text), 17);
        // Per backend, the summary row left out.
        assert_eq!(
            csv_requests(&rule, text),
            [("a".into(), 3), ("b".into(), 3)]
        );
    }

    #[test]
    fn json_objects_and_arrays() {
        let object =
            r#"{"serverStatus":{"http://127.0.0.1:9001":"UP","http://127.0.0.1:9002":"DOWN"}}"#;
        let rule = JsonRule {
            at: "/serverStatus".into(),
            id: None,
            status: None,
        };
        assert_eq!(
            json_statuses(&rule, object).unwrap()[1],
            ("http://127.0.0.1:9002".into(), "DOWN".into())
        );
        let array = r#"[{"address":"127.0.0.1:9001","healthy":true}]"#;
        let rule = JsonRule {
            at: String::new(),
            id: Some("address".into()),
            status: Some("healthy".into()),
        };
        assert_eq!(
            json_statuses(&rule, array).unwrap(),
            [("127.0.0.1:9001".into(), "true".into())]
        );
        assert!(
            json_statuses(&rule, "<html>")
                .unwrap_err()
                .contains("not JSON")
        );
    }

    #[test]
    fn log_lines_with_both_members() {
        let text = "{\"msg\":\"server running\",\"name\":\"lb\"}\nnot json\n\
            {\"msg\":\"event\",\"name\":\"unhealthy\",\"data\":{\"host\":\"127.0.0.1:9002\"}}\n";
        let rule = LogRule {
            key: "/data/host".into(),
            status: "/name".into(),
        };
        assert_eq!(
            log_statuses(&rule, text),
            [("127.0.0.1:9002".into(), "unhealthy".into())]
        );
    }

    #[test]
    fn prometheus_series_by_label_and_summed() {
        let text = "# HELP x\n# TYPE up gauge\n\
            up{upstream=\"127.0.0.1:9001\",x=\"a,\\\"b\"} 1\n\
            up{upstream=\"127.0.0.1:9002\"} 0\nupper 7\n\
            retries_total{service=\"be@file\"} 3\nretries_total{service=\"x\"} 2\n";
        let rule = PromRule {
            metric: "up".into(),
            label: Some("upstream".into()),
        };
        assert_eq!(
            prom_statuses(&rule, text),
            [
                ("127.0.0.1:9001".into(), "1".into()),
                ("127.0.0.1:9002".into(), "0".into())
            ]
        );
        let rule = PromRule {
            metric: "retries_total".into(),
            label: None,
        };
        assert_eq!(prom_count(&rule, text), 5);
    }
}
