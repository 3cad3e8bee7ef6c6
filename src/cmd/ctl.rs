//! `snag ctl`: a small client for the control API, so nobody needs curl. It speaks
//! the same Toxiproxy v2 API as every other client, so it drives Toxiproxy too.

use hyper::Method;
use serde_json::{Value, json};

use crate::{
    api::client::Client,
    cli::{CtlArgs, CtlCommand},
    fault::{
        Mode,
        drain::{Drain, DrainMode},
    },
};

/// Runs one `snag ctl` command and prints its result for people.
pub async fn run(args: CtlArgs) -> anyhow::Result<()> {
    let client = Client::new(args.api, args.token);
    match args.command {
        CtlCommand::List => {
            let proxies = client.call(Method::GET, "/proxies", None).await?;
            print_table(&proxies);
        }
        CtlCommand::Create {
            name,
            listen,
            upstream,
            disabled,
            mode,
            probe_listen,
            probe_paths,
            capture,
        } => {
            let mut body = json!({ "name": name, "listen": listen, "upstream": upstream, "enabled": !disabled });
            // Toxiproxy's own fields only unless asked: its server would ignore the rest.
            if mode != Mode::Tcp {
                body["mode"] = json!(mode.as_str());
            }
            if let Some(at) = probe_listen {
                body["probe_listen"] = json!(at);
            }
            if !probe_paths.is_empty() {
                body["probe"] = json!({ "paths": probe_paths });
            }
            if let Some(file) = capture {
                body["capture"] = json!(file);
            }
            let proxy = client.call(Method::POST, "/proxies", Some(body)).await?;
            say!(
                "created {} listening on {} → {}{}{}",
                proxy["name"],
                proxy["listen"],
                proxy["upstream"],
                proxy["mode"]
                    .as_str()
                    .map_or(String::new(), |m| format!(", mode {m}")),
                proxy["probe_listen"]
                    .as_str()
                    .map_or(String::new(), |p| format!(", probes on {p}"))
            );
        }
        CtlCommand::Capture { name, state } => {
            let on = state == "on";
            client
                .call(
                    Method::POST,
                    &format!("/proxies/{name}"),
                    Some(json!({ "capture": on })),
                )
                .await?;
            say!(
                "{name}: new connections {}",
                if on { "captured" } else { "not captured" }
            );
        }
        CtlCommand::Toggle { name } => {
            let path = format!("/proxies/{name}");
            let proxy = client.call(Method::GET, &path, None).await?;
            let enabled = !proxy["enabled"].as_bool().unwrap_or(false);
            client
                .call(Method::POST, &path, Some(json!({ "enabled": enabled })))
                .await?;
            say!("{name} {}", if enabled { "enabled" } else { "disabled" });
        }
        CtlCommand::Add { name, fault } => {
            let toxic = client
                .call(
                    Method::POST,
                    &format!("/proxies/{name}/toxics"),
                    Some(fault.to_json()),
                )
                .await?;
            say!(
                "added {} to {name}: {} {} scope {} toxicity {} {}",
                toxic["name"],
                toxic["type"],
                toxic["stream"],
                toxic["scope"].as_str().unwrap_or("any"),
                toxic["toxicity"],
                toxic["attributes"]
            );
        }
        CtlCommand::Remove { name, fault } => {
            client
                .call(
                    Method::DELETE,
                    &format!("/proxies/{name}/toxics/{fault}"),
                    None,
                )
                .await?;
            say!("removed {fault} from {name}");
        }
        CtlCommand::Delete { name } => {
            client
                .call(Method::DELETE, &format!("/proxies/{name}"), None)
                .await?;
            say!("deleted {name}");
        }
        CtlCommand::Drain { name, drain } => {
            let body = serde_json::to_value(drain).expect("a drain serialises");
            client
                .call(Method::POST, &format!("/proxies/{name}/drain"), Some(body))
                .await?;
            say!("{name} draining: {}", describe_drain(&drain));
        }
        CtlCommand::Undrain { name } => {
            client
                .call(Method::DELETE, &format!("/proxies/{name}/drain"), None)
                .await?;
            say!("{name} accepting again");
        }
        CtlCommand::Stats { name, reset } => {
            let stats = if reset {
                client
                    .call(Method::POST, &format!("/proxies/{name}/stats/reset"), None)
                    .await?
            } else {
                client
                    .call(Method::GET, &format!("/proxies/{name}/stats"), None)
                    .await?
            };
            print_stats(&stats);
        }
        CtlCommand::Reset => {
            client.call(Method::POST, "/reset", None).await?;
            say!("every proxy enabled, every fault removed");
        }
    }
    Ok(())
}

fn print_table(proxies: &Value) {
    let Some(map) = proxies.as_object() else {
        return;
    };
    let rows: Vec<[String; 5]> = map
        .values()
        .map(|p| {
            let toxics: Vec<String> = p["toxics"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|t| {
                    format!(
                        "{} ({} {})",
                        t["name"].as_str().unwrap_or(""),
                        t["type"].as_str().unwrap_or(""),
                        t["stream"].as_str().unwrap_or("")
                    )
                })
                .collect();
            [
                p["name"].as_str().unwrap_or("").to_string(),
                p["listen"].as_str().unwrap_or("").to_string(),
                p["upstream"].as_str().unwrap_or("").to_string(),
                if p["enabled"].as_bool() == Some(true) {
                    "yes"
                } else {
                    "no"
                }
                .to_string(),
                if toxics.is_empty() {
                    "–".to_string()
                } else {
                    toxics.join(", ")
                },
            ]
        })
        .collect();
    let head = ["proxy", "listen", "upstream", "enabled", "faults"];
    let widths: Vec<usize> = (0..4)
        .map(|i| {
            rows.iter()
                .map(|r| r[i].chars().count())
                .chain([head[i].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |r: [&str; 5]| {
        format!(
            "{:w0$}  {:w1$}  {:w2$}  {:w3$}  {}",
            r[0],
            r[1],
            r[2],
            r[3],
            r[4],
            w0 = widths[0],
            w1 = widths[1],
            w2 = widths[2],
            w3 = widths[3]
        )
    };
    say!("{}", line(head));
    for r in &rows {
        say!("{}", line([&r[0], &r[1], &r[2], &r[3], &r[4]]));
    }
    if rows.is_empty() {
        say!("(no proxies)");
    }
}

fn describe_drain(d: &Drain) -> String {
    let new = match d.new {
        crate::fault::drain::NewConns::Refuse => "new connections refused",
        crate::fault::drain::NewConns::Ignore => "new connections left unanswered",
    };
    match d.mode {
        DrainMode::Graceful => format!("graceful, {new}"),
        DrainMode::Slow => format!("slow at {} KB/s, {new}", d.rate),
        DrainMode::Deadline => format!("deadline {} ms, then reset, {new}", d.timeout),
        DrainMode::Abrupt => format!("abrupt: everything reset, {new}"),
        DrainMode::Readiness => format!(
            "readiness: probes fail for {} ms, then {}",
            d.grace,
            if d.timeout > 0 {
                format!("deadline {} ms, {new}", d.timeout)
            } else {
                format!("graceful, {new}")
            }
        ),
    }
}

/// The stats as `key  value` lines, nested keys joined with dots, aligned.
fn print_stats(stats: &Value) {
    fn flatten(prefix: &str, v: &Value, out: &mut Vec<(String, String)>) {
        match v {
            Value::Object(map) => {
                for (k, v) in map {
                    let key = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    flatten(&key, v, out);
                }
            }
            Value::Array(items) => {
                out.push((prefix.to_string(), format!("{} entries", items.len())))
            }
            Value::String(s) => out.push((prefix.to_string(), s.clone())),
            other => out.push((prefix.to_string(), other.to_string())),
        }
    }
    let mut rows = Vec::new();
    flatten("", stats, &mut rows);
    let width = rows
        .iter()
        .map(|(k, _)| k.chars().count())
        .max()
        .unwrap_or(0);
    for (key, value) in rows {
        say!("{key:width$}  {value}");
    }
}
