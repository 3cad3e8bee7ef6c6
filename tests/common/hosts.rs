//! Hosts made of network namespaces of the test's own, and the shell scripts that
//! wire and run them.

/// Network namespaces `snag-test-PID-NAME`, made now and deleted when dropped.
pub struct Namespaces(pub Vec<String>);

impl Namespaces {
    /// One namespace per name; needs root.
    pub fn new(names: &[&str]) -> Namespaces {
        let tag = format!("snag-test-{}", std::process::id());
        let made = Namespaces(names.iter().map(|n| format!("{tag}-{n}")).collect());
        for n in &made.0 {
            let status = std::process::Command::new("ip")
                .args(["netns", "add", n])
                .status()
                .expect("`ip` runs (iproute2; scripts/install-deps.sh installs it)");
            assert!(status.success(), "creating a network namespace needs root");
        }
        made
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for ns in &self.0 {
            let _ = std::process::Command::new("ip")
                .args(["netns", "delete", ns])
                .status();
        }
    }
}

/// Runs `script` with bash to its end: its stdout, or a panic showing both outputs
/// when it fails.
pub fn bash(script: &str) -> String {
    let run = std::process::Command::new("bash")
        .args(["-c", script])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout).into_owned();
    assert!(
        run.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    stdout
}
