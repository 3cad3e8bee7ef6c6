//! `snag` as a process, one way for every test: its stdout read line by line as it
//! comes, its lines and its exit waited for with deadlines (on the events, never by
//! polling), signals and kills by its PID, and a kill if the test ends first.

use std::{
    process::{ExitStatus, Stdio},
    time::Duration,
};

use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, Command},
    sync::mpsc,
};

/// `snag ARGS` with stdout read by the harness and stderr discarded; change what else
/// the test needs before [`Process::spawn`].
pub fn snag(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_snag"));
    command.args(args).stderr(Stdio::null());
    command
}

/// A running `snag`, killed by its PID when dropped before it exited.
pub struct Process {
    child: Child,
    lines: mpsc::UnboundedReceiver<String>,
    /// Every stdout line read so far.
    pub stdout: Vec<String>,
}

impl Process {
    /// Starts `command` with its stdout piped to the harness.
    pub fn spawn(mut command: Command) -> Process {
        let mut child = command
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("snag starts");
        let stdout = child.stdout.take().expect("stdout is piped");
        let (tx, lines) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut reader = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Process {
            child,
            lines,
            stdout: Vec::new(),
        }
    }

    /// Runs `command` to its end within `secs`: its exit code and stdout.
    pub async fn run(command: Command, secs: u64) -> (i32, String) {
        let mut process = Process::spawn(command);
        let status = process.exit(secs).await;
        (status.code().unwrap_or(-1), process.stdout.join("\n"))
    }

    /// Its PID.
    pub fn pid(&self) -> u32 {
        self.child.id().expect("it has not been waited for")
    }

    /// The first stdout line from now on that `pick` takes, within `secs`.
    pub async fn line<T>(&mut self, secs: u64, mut pick: impl FnMut(&str) -> Option<T>) -> T {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
        loop {
            match tokio::time::timeout_at(deadline, self.lines.recv()).await {
                Ok(Some(line)) => {
                    let picked = pick(&line);
                    self.stdout.push(line);
                    if let Some(picked) = picked {
                        return picked;
                    }
                }
                Ok(None) => panic!(
                    "snag closed its stdout without the line; it said:\n{}",
                    self.stdout.join("\n")
                ),
                Err(_) => panic!(
                    "snag did not print the line within {secs} s; it said:\n{}",
                    self.stdout.join("\n")
                ),
            }
        }
    }

    /// Sends `signal` to it, by its PID.
    pub fn signal(&self, signal: Signal) {
        let pid = Pid::from_raw(i32::try_from(self.pid()).expect("a PID fits"));
        kill(pid, signal).expect("it is ours and alive");
    }

    /// Its exit status within `secs`, with the rest of its stdout read; past the
    /// deadline it is killed and the test fails.
    pub async fn exit(&mut self, secs: u64) -> ExitStatus {
        let status = match tokio::time::timeout(Duration::from_secs(secs), self.child.wait()).await
        {
            Ok(status) => status.expect("waiting for snag"),
            Err(_) => {
                let _ = self.child.kill().await;
                panic!(
                    "snag did not exit within {secs} s; it said:\n{}",
                    self.stdout.join("\n")
                );
            }
        };
        // Its stdout ends with it; a child of its own still holding the pipe gets a
        // few seconds.
        let drain = async {
            while let Some(line) = self.lines.recv().await {
                self.stdout.push(line);
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(5), drain).await;
        status
    }
}

/// [`Process::run`] for a test that is not async.
pub fn run_blocking(command: Command, secs: u64) -> (i32, String) {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(Process::run(command, secs))
}

/// `snag ARGS` run to its end, for commands that end at once: exit code, stdout,
/// stderr.
pub fn output(args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_snag"))
        .args(args)
        .output()
        .expect("snag runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
