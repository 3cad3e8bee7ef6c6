//! A running product's own view of each backend, read by its driver's rule, and the
//! lines of its output the driver marks: both into the case's timeline.

use std::{sync::Arc, time::Duration};

use tokio::time::Instant;

use super::{External, Seen, rule};

/// Reads the driver's view every `every_ms` and records each backend's status
/// changes, and the marked lines of its output.
pub(super) async fn watch(external: Arc<External>) {
    let driver = external.driver.clone();
    let mut last: std::collections::BTreeMap<String, String> = Default::default();
    let (mut read, mut read_view) = (0, 0);
    // A log tells changes only: every backend starts up.
    if driver.view().is_some_and(|v| v.log.is_some()) {
        for b in &external.config.backends {
            last.insert(b.id.clone(), "UP".to_string());
        }
    }
    let every = driver.view().map_or(50, |v| v.every_ms.max(10));
    let mut ticks = tokio::time::interval(Duration::from_millis(every));
    loop {
        tokio::select! {
            _ = external.stop.wait() => return,
            _ = ticks.tick() => {}
        }
        if let Some(log) = driver.log() {
            read = external.read_log(read, &log.contains);
        }
        let Some(view) = driver.view() else { continue };
        let statuses = if let Some(log) = &view.log {
            let (lines, end) = external.new_lines(read_view);
            read_view = end;
            rule::log_statuses(log, &lines)
                .into_iter()
                .filter(|(_, status)| view.states.contains_key(status))
                .collect()
        } else {
            let text = match external
                .perform("view", &view.query(), &external.context())
                .await
            {
                Ok(text) => {
                    *external.unread.lock().expect("no code panics holding it") = None;
                    text
                }
                Err(err) => {
                    *external.unread.lock().expect("no code panics holding it") =
                        Some(format!("{err:#}"));
                    continue;
                }
            };
            if let Some(csv) = view.csv.as_ref().filter(|c| !c.requests.is_empty()) {
                external.count(rule::csv_requests(csv, &text));
            }
            match (&view.csv, &view.json, &view.prometheus) {
                (Some(csv), _, _) => rule::csv_statuses(csv, &text),
                (_, Some(json), _) => rule::json_statuses(json, &text).unwrap_or_default(),
                (_, _, Some(prom)) => rule::prom_statuses(prom, &text),
                _ => Vec::new(),
            }
        };
        for (key, status) in statuses {
            let Some(id) = external.backend_of(&key) else {
                continue;
            };
            // "UP 1/3" is still up, going down: only the state word counts.
            let word = status.split(' ').next().unwrap_or_default();
            let status = view
                .states
                .get(word)
                .cloned()
                .unwrap_or_else(|| word.to_uppercase());
            let before = last.insert(id.clone(), status.clone());
            if let Some(before) = before
                && before != status
            {
                external
                    .seen
                    .lock()
                    .expect("no code panics holding the log")
                    .push(Seen {
                        at: Instant::now(),
                        id,
                        from: before,
                        to: status,
                    });
            }
        }
        external
            .states
            .lock()
            .expect("no code panics holding it")
            .clone_from(&last);
    }
}

impl External {
    /// Keeps one reading of each backend's request count, by id.
    fn count(&self, by_key: Vec<(String, u64)>) {
        let by_id = by_key
            .into_iter()
            .filter_map(|(key, n)| Some((self.backend_of(&key)?, n)))
            .collect();
        self.counts
            .lock()
            .expect("no code panics holding it")
            .push((Instant::now(), by_id));
    }

    /// The backend a view's key names: its id, or a key containing its address
    /// (`http://127.0.0.1:9001`).
    fn backend_of(&self, key: &str) -> Option<String> {
        let backends = &self.config.backends;
        // Watching a product set up by hand with no names given: its own names.
        if backends.is_empty() {
            return Some(key.to_string());
        }
        backends
            .iter()
            .find(|b| b.id == key)
            .or_else(|| {
                backends.iter().find(|b| {
                    let addr = b.addr.to_string();
                    key == addr
                        || key
                            .strip_suffix(addr.as_str())
                            .is_some_and(|rest| rest.ends_with("//"))
                        || key.contains(&format!("//{addr}/"))
                })
            })
            .map(|b| b.id.clone())
    }

    /// Reads whole new lines of its output from byte `read`, keeping those
    /// containing `marker` (from the marker on); where the next read starts.
    fn read_log(&self, read: usize, marker: &str) -> usize {
        let (lines, end) = self.new_lines(read);
        let now = Instant::now();
        for line in lines.lines() {
            if let Some(at) = line.find(marker) {
                self.logged
                    .lock()
                    .expect("no code panics holding the log")
                    .push((now, line[at..].to_string()));
            }
        }
        end
    }

    /// The whole lines of its output from byte `read` on, and where the next
    /// read starts: a line being written is read on the next tick.
    fn new_lines(&self, read: usize) -> (String, usize) {
        let Ok(log) = std::fs::read(&self.log) else {
            return (String::new(), read);
        };
        if log.len() <= read {
            return (String::new(), read);
        }
        let end = log[read..]
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(read, |i| read + i + 1);
        (String::from_utf8_lossy(&log[read..end]).into_owned(), end)
    }
}
