//! `snag ports`: the port accounting as a table or JSON, once or every `--watch`.

use crate::{cli::PortsArgs, ports, shutdown::Shutdown};

/// `snag ports`: once, or every `--watch` until `shutdown`.
pub async fn run(args: PortsArgs, shutdown: Shutdown) -> anyhow::Result<()> {
    loop {
        let report = ports::report(&ports::sockets()?, ports::Limits::read()?, args.dest);
        if args.json {
            say!(
                "{}",
                serde_json::to_string(&report).expect("reports serialise")
            );
        } else {
            print_ports(&report);
        }
        let Some(every) = args.watch else {
            return Ok(());
        };
        tokio::select! {
            _ = shutdown.wait() => return Ok(()),
            _ = tokio::time::sleep(every) => {}
        }
    }
}

fn print_ports(r: &ports::Report) {
    let states: Vec<String> = r.states.iter().map(|(s, n)| format!("{s} {n}")).collect();
    say!(
        "sockets by state: {}",
        if states.is_empty() {
            "none".into()
        } else {
            states.join(", ")
        }
    );
    let l = r.limits;
    say!(
        "ephemeral ports {}–{}: {} per destination (a port in use towards one destination is free towards another); tcp_tw_reuse {}, tcp_fin_timeout {} s",
        l.ephemeral.0,
        l.ephemeral.1,
        r.pool,
        l.tw_reuse,
        l.fin_timeout
    );
    say!(
        "{:<46}  {:>7}  {:>9}  {:>8}  {:>6}",
        "destination",
        "in use",
        "TIME_WAIT",
        "headroom",
        "used"
    );
    for d in r.destinations.iter().take(20) {
        say!(
            "{:<46}  {:>7}  {:>9}  {:>8}  {:>5.1} %",
            d.dest.to_string(),
            d.ports_in_use,
            d.time_wait,
            d.headroom,
            d.used_percent
        );
    }
    if r.destinations.len() > 20 {
        say!("… and {} more destinations", r.destinations.len() - 20);
    }
    say!();
}
