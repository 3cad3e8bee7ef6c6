//! `GET /metrics`: Toxiproxy's Prometheus families, byte counts per proxy and
//! direction, and snag's runtime gauges.

use super::Registry;

impl Registry {
    /// The Prometheus text for the families `metrics` selects.
    pub fn metrics(&self, metrics: crate::api::Metrics) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        if metrics.proxy {
            let families = [
                (
                    "received",
                    "The total bytes received from a given direction",
                ),
                ("sent", "The total bytes sent to a given direction"),
            ];
            for (what, help) in families {
                let family = format!("toxiproxy_proxy_{what}_bytes_total");
                let _ = writeln!(out, "# HELP {family} {help}\n# TYPE {family} counter");
                for (name, entry) in &self.entries {
                    let t = entry.proxy.traffic();
                    let (up, down) = if what == "received" {
                        (t.received_up, t.received_down)
                    } else {
                        (t.sent_up, t.sent_down)
                    };
                    for (direction, n) in [("downstream", down), ("upstream", up)] {
                        let _ = writeln!(
                            out,
                            "{family}{{direction=\"{direction}\",listener=\"{}\",proxy=\"{}\",upstream=\"{}\"}} {n}",
                            label(&entry.listen),
                            label(name),
                            label(&entry.proxy.upstream())
                        );
                    }
                }
            }
        }
        if metrics.runtime {
            let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
            let rss_kib: u64 = status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
                .unwrap_or(0);
            let fds = std::fs::read_dir("/proc/self/fd")
                .map(|d| d.count())
                .unwrap_or(0);
            let _ = writeln!(
                out,
                "# HELP process_resident_memory_bytes Resident memory size in bytes.\n# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes {}",
                rss_kib * 1024
            );
            let _ = writeln!(
                out,
                "# HELP process_open_fds Number of open file descriptors.\n# TYPE process_open_fds gauge\nprocess_open_fds {fds}"
            );
            let tasks = tokio::runtime::Handle::current()
                .metrics()
                .num_alive_tasks()
                + self.context.workers.as_ref().map_or(0, |w| w.alive_tasks());
            let _ = writeln!(
                out,
                "# HELP snag_tasks Tasks alive in snag's runtime (connections, listeners, timers).\n# TYPE snag_tasks gauge\nsnag_tasks {tasks}"
            );
        }
        out
    }
}

/// A Prometheus label value: backslash, quote and newline escaped.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
