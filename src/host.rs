//! How busy the machine was during a run, apart from snag: the CPU time every
//! process used (from `/proc/stat`) less what this process and its children used
//! (from `/proc/PID/stat`). A case whose check fails while other programs took the
//! CPU says HOST, with these figures, rather than blaming the balancer. A leaf.

use std::time::Instant;

use serde::Serialize;

/// Clock ticks per second of `/proc`'s CPU times: `USER_HZ`, 100 on every Linux
/// architecture snag builds for.
const TICKS_PER_S: f64 = 100.0;

/// Other programs averaging this many cores or more leave a 2-core machine too busy
/// to judge timing and throughput properties: a quarter of a core is an eighth of
/// its capacity, and a compiler beside the cases took about half a core.
pub const BUSY_CORES: f64 = 0.25;

/// CPU times read at one instant.
#[derive(Debug, Clone, Copy)]
pub struct Mark {
    at: Instant,
    /// Ticks every CPU spent not idle, all processes.
    busy: u64,
    /// Ticks of this process (all threads) and of its children, live or reaped.
    ours: u64,
}

/// What the machine did between two marks.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Load {
    /// Online CPUs.
    pub cores: usize,
    /// Cores' worth of CPU other programs used, on average.
    pub other_cores: f64,
    /// Cores' worth snag and the processes it started used, on average.
    pub own_cores: f64,
    /// Seconds between the marks.
    pub seconds: f64,
}

impl Load {
    /// Whether other programs used enough CPU to make timing and shares unreliable.
    pub fn busy(&self) -> bool {
        self.other_cores >= BUSY_CORES
    }

    /// The figures in words, for a report.
    pub fn describe(&self) -> String {
        format!(
            "other programs used {:.2} of {} cores, snag and its children {:.2}, over {:.1} s",
            self.other_cores, self.cores, self.own_cores, self.seconds
        )
    }
}

impl Mark {
    /// Reads the CPU times now; `None` where `/proc` does not have them.
    pub fn now() -> Option<Mark> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let me = std::process::id();
        let mut ours = own_ticks(&std::fs::read_to_string("/proc/self/stat").ok()?)?;
        // Children still running (HAProxy, nginx, backends started as processes):
        // their time reaches our own counters only once they are reaped.
        if let Ok(dir) = std::fs::read_dir("/proc") {
            for entry in dir.flatten() {
                let name = entry.file_name();
                let Some(pid) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else {
                    continue;
                };
                if pid == me {
                    continue;
                }
                let Ok(text) = std::fs::read_to_string(entry.path().join("stat")) else {
                    continue;
                };
                if parent(&text) == Some(me) {
                    ours += own_ticks(&text).unwrap_or(0);
                }
            }
        }
        Some(Mark {
            at: Instant::now(),
            busy: busy_ticks(&stat)?,
            ours,
        })
    }

    /// The load from this mark to `later`.
    pub fn until(&self, later: &Mark) -> Load {
        let seconds = later.at.duration_since(self.at).as_secs_f64().max(1e-3);
        let busy = later.busy.saturating_sub(self.busy) as f64 / TICKS_PER_S;
        let ours = later.ours.saturating_sub(self.ours) as f64 / TICKS_PER_S;
        Load {
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            other_cores: ((busy - ours) / seconds).max(0.0),
            own_cores: ours / seconds,
            seconds,
        }
    }
}

/// The non-idle ticks of the `cpu` line of `/proc/stat`: everything but idle and
/// iowait (guest time is already inside user).
fn busy_ticks(stat: &str) -> Option<u64> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    let (user, nice, system, irq, softirq, steal) = (
        *fields.first()?,
        *fields.get(1)?,
        *fields.get(2)?,
        fields.get(5).copied().unwrap_or(0),
        fields.get(6).copied().unwrap_or(0),
        fields.get(7).copied().unwrap_or(0),
    );
    Some(user + nice + system + irq + softirq + steal)
}

/// The fields of `/proc/PID/stat` after the command name, which may hold spaces.
fn after_comm(stat: &str) -> Option<Vec<&str>> {
    let rest = &stat[stat.rfind(')')? + 1..];
    Some(rest.split_whitespace().collect())
}

/// utime + stime + cutime + cstime (fields 14–17 of `/proc/PID/stat`).
fn own_ticks(stat: &str) -> Option<u64> {
    let f = after_comm(stat)?;
    // After the name, field 3 (state) is index 0: utime (14) is index 11.
    (11..15).map(|i| f.get(i)?.parse::<u64>().ok()).sum()
}

/// The parent PID (field 4).
fn parent(stat: &str) -> Option<u32> {
    after_comm(stat)?.get(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_stat_lines_read_as_busy_ticks() {
        let stat = "cpu  100 5 50 1000 20 3 2 1 0 0\ncpu0 50 2 25 500 10 1 1 0 0 0\n";
        assert_eq!(busy_ticks(stat), Some(100 + 5 + 50 + 3 + 2 + 1));
        assert_eq!(busy_ticks("intr 1 2 3\n"), None);
    }

    #[test]
    fn a_process_stat_with_spaces_in_its_name_reads_its_times_and_parent() {
        let stat =
            "4242 (snag worker) S 17 4242 17 0 -1 4194560 10 0 0 0 250 40 7 3 20 0 9 0 100 0 0";
        assert_eq!(own_ticks(stat), Some(250 + 40 + 7 + 3));
        assert_eq!(parent(stat), Some(17));
    }

    #[test]
    fn others_are_what_is_busy_beyond_ours() {
        let t = Instant::now();
        let a = Mark {
            at: t,
            busy: 1000,
            ours: 400,
        };
        let b = Mark {
            at: t + std::time::Duration::from_secs(2),
            busy: 1000 + 300,
            ours: 400 + 100,
        };
        let load = a.until(&b);
        assert!((load.other_cores - 1.0).abs() < 1e-9, "{load:?}");
        assert!((load.own_cores - 0.5).abs() < 1e-9, "{load:?}");
        assert!(load.busy());
        let quiet = Mark {
            busy: 1000 + 120,
            ..b
        };
        assert!(!a.until(&quiet).busy());
    }

    #[test]
    fn this_machine_can_be_read() {
        let a = Mark::now().expect("/proc is there on Linux");
        let load = a.until(&Mark::now().unwrap());
        assert!(load.other_cores >= 0.0 && load.cores >= 1);
    }
}
