//! What the soak judges by: every figure it measured, and the eleven checks.

use super::{Counts, FD_SLACK, Sample};
use crate::{host, report::Check};

/// Everything the soak measured, for [`judge`].
pub(super) struct Observed<'a> {
    /// Connections it was asked to hold.
    pub(super) target_connections: usize,
    pub(super) alive_under_load: bool,
    /// snag serve's log.
    pub(super) stderr: String,
    /// tcp-clean, tcp-chaos, http-clean, http-chaos.
    pub(super) counts: [Counts; 4],
    /// API calls made to change faults and drain, and those that failed.
    pub(super) calls: u64,
    pub(super) api_failures: Vec<String>,
    /// snag serve before the load and once it let go (or why it could not be read).
    pub(super) baseline: Sample,
    pub(super) end: Result<Sample, String>,
    /// Idle pooled connections to the HTTP backend at the end (not a leak).
    pub(super) pooled: u64,
    pub(super) samples: &'a [Sample],
    /// What other programs did meanwhile.
    pub(super) host: Option<host::Load>,
    pub(super) exit: Result<std::process::ExitStatus, String>,
    pub(super) interrupted: bool,
    pub(super) load_s: f64,
}

/// The checks, and the memory plateau they judged by (MiB): the median RSS of the
/// second half of the load.
pub(super) fn judge(o: &Observed) -> (Vec<Check>, f64) {
    let plateau = {
        let mut rss: Vec<f64> = o.samples[o.samples.len() / 2..]
            .iter()
            .map(|s| s.rss_mib)
            .collect();
        rss.sort_by(f64::total_cmp);
        rss.get(rss.len() / 2).copied().unwrap_or(0.0)
    };
    let peak = o.samples.iter().map(|s| s.connections).max().unwrap_or(0);
    let peak_rss = o.samples.iter().map(|s| s.rss_mib).fold(0.0, f64::max);
    let c = &o.counts;
    let mib = |bytes: u64| bytes as f64 / 1048576.0;
    let (calls, api_failures) = (o.calls, &o.api_failures);
    let (baseline, end, pooled, host, exit) = (&o.baseline, &o.end, o.pooled, o.host, &o.exit);
    let (alive_under_load, stderr) = (o.alive_under_load, &o.stderr);
    let mut checks = vec![
        check(
            "snag neither panicked nor exited under load",
            alive_under_load && !stderr.contains("panicked"),
            format!(
                "alive: {alive_under_load}; log: {} lines{}",
                stderr.lines().count(),
                if stderr.contains("panicked") {
                    ", has a panic"
                } else {
                    ""
                }
            ),
        ),
        check(
            "the connections were held at once",
            peak as f64 >= 0.95 * o.target_connections as f64,
            format!("peak {peak} open in snag, target {}", o.target_connections),
        ),
        check(
            "every byte through tcp-clean came back, none changed",
            c[0].failed + c[0].corrupted + c[0].ended == 0 && c[0].verified > 0,
            format!(
                "{} rounds, {:.1} MiB checked; failed {}, corrupted {}",
                c[0].ok,
                mib(c[0].verified),
                c[0].failed,
                c[0].corrupted
            ),
        ),
        check(
            "no byte changed through tcp-chaos (its faults may cut, never alter)",
            c[1].corrupted == 0 && c[1].failed == 0 && c[1].ok > 0,
            format!(
                "{} rounds ok, {} ended by a fault or the drain, {:.1} MiB checked, corrupted {}",
                c[1].ok,
                c[1].ended,
                mib(c[1].verified),
                c[1].corrupted
            ),
        ),
        check(
            "every http-clean answer was the request's body",
            c[2].failed + c[2].corrupted == 0 && c[2].ok > 0,
            format!(
                "{} requests, {:.1} MiB checked; {} closed under a request by a drain (retried), failed {}",
                c[2].ok,
                mib(c[2].verified),
                c[2].ended,
                c[2].failed
            ),
        ),
        check(
            "http-chaos kept answering through its faults",
            c[3].ok > 0 && c[3].ended > 0 && c[3].failed == 0,
            format!("{} intact, {} faulted", c[3].ok, c[3].ended),
        ),
        check(
            "every fault change and drain through the API was accepted",
            api_failures.is_empty() && calls > 0,
            format!(
                "{calls} calls; {}",
                if api_failures.is_empty() {
                    "no failures".to_string()
                } else {
                    api_failures.join("; ")
                }
            ),
        ),
        check(
            "no connection left open once the load stopped",
            end.as_ref().is_ok_and(|end| end.connections == 0),
            match end {
                Ok(end) => format!("{} open", end.connections),
                Err(err) => unread(err),
            },
        ),
        check(
            "no descriptor leaked",
            end.as_ref()
                .is_ok_and(|end| end.fds <= baseline.fds + pooled + FD_SLACK),
            match end {
                Ok(end) => format!(
                    "{} before the load, {} after ({} of them idle upstream connections in the HTTP pool)",
                    baseline.fds, end.fds, pooled
                ),
                Err(err) => unread(err),
            },
        ),
        {
            // Other programs slow the ramp: memory may still be rising when the load
            // stops, with no plateau to judge by. Then the peak is the reference:
            // what the close of every connection must not add to.
            let busy = host.filter(|h| h.busy());
            let reference = if busy.is_some() { peak_rss } else { plateau };
            check(
                "memory back within 10% of its plateau",
                end.as_ref()
                    .is_ok_and(|end| end.rss_mib <= reference * 1.10),
                match end {
                    Ok(end) => format!(
                        "plateau {plateau:.1} MiB, peak {peak_rss:.1} MiB, after {:.1} MiB ({:+.1}%{})",
                        end.rss_mib,
                        (end.rss_mib / reference.max(0.001) - 1.0) * 100.0,
                        busy.map_or(String::new(), |h| format!(
                            " of the peak: a busy host, {}",
                            h.describe()
                        ))
                    ),
                    Err(err) => unread(err),
                },
            )
        },
        check(
            "a signal stopped it cleanly",
            exit.as_ref().is_ok_and(|s| s.success()),
            match &exit {
                Ok(s) => format!("{s}"),
                Err(e) => e.clone(),
            },
        ),
    ];
    if o.interrupted {
        checks.push(check(
            "the run went its full length",
            false,
            format!("interrupted after {:.0} s", o.load_s),
        ));
    }

    (checks, plateau)
}

/// The detail of a check that needed snag's figures after the load and had none.
fn unread(err: &str) -> String {
    format!("snag's figures after the load could not be read within 30 s: {err}")
}

fn check(what: &str, passed: bool, detail: String) -> Check {
    Check {
        what: what.to_string(),
        passed,
        detail,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::soak::Tally;

    fn observed(samples: &[Sample], end: Result<Sample, String>) -> Observed<'_> {
        let tally = Tally::default();
        Observed {
            target_connections: 0,
            alive_under_load: true,
            stderr: String::new(),
            counts: [(); 4].map(|()| tally.counts()),
            calls: 1,
            api_failures: Vec::new(),
            baseline: Sample {
                fds: 20,
                ..Sample::default()
            },
            end,
            pooled: 0,
            samples,
            host: None,
            exit: Err("not run".into()),
            interrupted: false,
            load_s: 60.0,
        }
    }

    fn passed(checks: &[Check], what: &str) -> bool {
        checks
            .iter()
            .find(|c| c.what.starts_with(what))
            .unwrap()
            .passed
    }

    #[test]
    fn figures_that_could_not_be_read_after_the_load_fail_the_leak_checks() {
        let samples = [Sample {
            rss_mib: 100.0,
            connections: 9000,
            ..Sample::default()
        }];
        let after = Sample {
            rss_mib: 90.0,
            fds: 22,
            ..Sample::default()
        };
        let (checks, _) = judge(&observed(&samples, Ok(after)));
        for what in ["no connection", "no descriptor", "memory back"] {
            assert!(passed(&checks, what), "{what}: {checks:?}");
        }
        let unread = Err("GET /metrics: no answer within 10 s".to_string());
        let (checks, _) = judge(&observed(&samples, unread));
        for what in ["no connection", "no descriptor", "memory back"] {
            assert!(!passed(&checks, what), "{what}: {checks:?}");
            let detail = &checks
                .iter()
                .find(|c| c.what.starts_with(what))
                .unwrap()
                .detail;
            assert!(detail.contains("no answer within 10 s"), "{detail}");
        }
    }
}
