//! Port accounting against `ss`, an observer that reads the kernel through its own
//! path (netlink), with thousands of sockets left in TIME_WAIT on loopback.

mod common;

use common::within;
use tokio::{
    io::AsyncReadExt,
    net::{TcpListener, TcpStream},
};

#[tokio::test]
async fn time_wait_counts_agree_with_ss_within_two_percent() {
    within(60, async {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let dest = listener.local_addr().unwrap();
        // The server closes only after the client: the client's side ends in TIME_WAIT.
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let _ = s.read(&mut [0; 1]).await;
                });
            }
        });
        const N: usize = 3000;
        for _ in 0..N / 100 {
            let mut tasks = Vec::new();
            for _ in 0..100 {
                tasks.push(tokio::spawn(async move {
                    drop(TcpStream::connect(dest).await.unwrap())
                }));
            }
            for t in tasks {
                t.await.unwrap();
            }
        }
        // Wait for the closes to settle: both sides' FINs processed.
        let ours = within(10, async {
            loop {
                let report = snag::ports::report(
                    &snag::ports::sockets().unwrap(),
                    snag::ports::Limits::read().unwrap(),
                    Some(dest),
                );
                let tw = report.destinations[0].time_wait;
                if tw >= N * 98 / 100 {
                    break report;
                }
                tokio::task::yield_now().await;
            }
        })
        .await;
        let out = std::process::Command::new("ss")
            .args(["-tan", "state", "time-wait", "dst", &dest.to_string()])
            .output()
            .expect("ss is installed (iproute2)");
        let theirs = String::from_utf8_lossy(&out.stdout).lines().skip(1).count();
        let mine = ours.destinations[0].time_wait;
        let diff = mine.abs_diff(theirs) as f64 / theirs.max(1) as f64;
        assert!(
            diff <= 0.02,
            "snag counts {mine} in TIME_WAIT to {dest}, ss {theirs}"
        );
        assert!(mine >= N * 98 / 100, "{mine} of {N}");
        assert_eq!(
            ours.destinations[0].headroom,
            i64::from(ours.pool) - ours.destinations[0].ports_in_use as i64
        );
    })
    .await;
}
