//! Where a case's parts listen: on ports the kernel picks, or, with `--port-range`,
//! only inside a range the user gave (a firewall's opening, a range set aside on a
//! shared host). The generator's own source ports are the kernel's ephemeral range.

use std::{
    fmt, io,
    net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener},
    str::FromStr,
    sync::{Arc, Mutex},
};

/// Hands out listeners on loopback (or on the address other hosts reach this one
/// at), inside a range if one is set.
#[derive(Debug, Clone, Default)]
pub struct Ports {
    range: Option<Arc<Range>>,
    /// `None`: 127.0.0.1.
    ip: Option<IpAddr>,
}

#[derive(Debug)]
struct Range {
    first: u16,
    last: u16,
    /// The port tried next: the range is walked round, so that a port a finished
    /// part left is the last to be taken again.
    next: Mutex<u16>,
}

impl FromStr for Ports {
    type Err = String;

    /// `FIRST-LAST`, inclusive: `41000-41999`.
    fn from_str(s: &str) -> Result<Ports, String> {
        let (first, last) = s
            .split_once('-')
            .ok_or_else(|| format!("{s:?}: expected FIRST-LAST, as in 41000-41999"))?;
        let port = |p: &str| {
            p.trim()
                .parse::<u16>()
                .ok()
                .filter(|&p| p > 0)
                .ok_or_else(|| format!("{s:?}: {p:?} is not a port (1 to 65535)"))
        };
        let (first, last) = (port(first)?, port(last)?);
        if first > last {
            return Err(format!("{s:?}: the first port is above the last"));
        }
        Ok(Ports {
            range: Some(Arc::new(Range {
                first,
                last,
                next: Mutex::new(first),
            })),
            ip: None,
        })
    }
}

impl fmt::Display for Ports {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.range {
            Some(r) => write!(f, "{}-{}", r.first, r.last),
            None => f.write_str("any"),
        }
    }
}

impl Ports {
    /// These ports on `ip` instead of loopback: for parts other hosts must reach.
    pub fn on(mut self, ip: IpAddr) -> Ports {
        self.ip = Some(ip);
        self
    }

    fn ip(&self) -> IpAddr {
        self.ip.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
    }

    /// A loopback listener: on a port the kernel picks, or the next free one in
    /// the range; `Err` when every port of the range is taken.
    pub fn bind(&self) -> io::Result<TcpListener> {
        let Some(range) = &self.range else {
            return TcpListener::bind((self.ip(), 0));
        };
        let mut next = range.next.lock().expect("no code panics holding it");
        let count = u32::from(range.last - range.first) + 1;
        for _ in 0..count {
            let port = *next;
            *next = if port == range.last {
                range.first
            } else {
                port + 1
            };
            if let Ok(listener) = TcpListener::bind((self.ip(), port)) {
                return Ok(listener);
            }
        }
        Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            format!(
                "--port-range {}-{}: all {count} ports are in use",
                range.first, range.last
            ),
        ))
    }

    /// [`Ports::bind`] for the runtime.
    pub fn listener(&self) -> io::Result<tokio::net::TcpListener> {
        let listener = self.bind()?;
        listener.set_nonblocking(true)?;
        tokio::net::TcpListener::from_std(listener)
    }

    /// A free address for a part that must be told its port before it binds (a
    /// product): free when asked, and no other part of this run is given it after.
    pub fn free(&self) -> io::Result<SocketAddr> {
        self.bind()?.local_addr()
    }

    /// The address a part that binds by itself (an interposer) is given: port 0,
    /// so that its own bind picks a port and no other socket can take it in
    /// between; inside a range, a free one of the range.
    pub fn any(&self) -> io::Result<SocketAddr> {
        match &self.range {
            Some(_) => self.free(),
            None => Ok(SocketAddr::from((self.ip(), 0))),
        }
    }

    /// Whether `port` is one these hand out.
    pub fn contains(&self, port: u16) -> bool {
        self.range
            .as_ref()
            .is_none_or(|r| (r.first..=r.last).contains(&port))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_reads_first_dash_last_and_says_what_is_wrong() {
        assert_eq!(
            "41000-41009".parse::<Ports>().unwrap().to_string(),
            "41000-41009"
        );
        for (bad, why) in [
            ("41000", "expected FIRST-LAST"),
            ("41000-x", "\"x\" is not a port"),
            ("0-10", "\"0\" is not a port"),
            ("41009-41000", "first port is above the last"),
            ("41000-70000", "\"70000\" is not a port"),
        ] {
            let err = bad.parse::<Ports>().unwrap_err();
            assert!(err.contains(why), "{bad}: {err}");
        }
        assert_eq!(Ports::default().to_string(), "any");
    }

    #[test]
    fn listeners_stay_inside_the_range_walk_it_round_and_say_when_it_is_full() {
        // A range the kernel is unlikely to hand out as ephemeral ports.
        let ports: Ports = "29170-29173".parse().unwrap();
        let held: Vec<TcpListener> = (0..4).map(|_| ports.bind().unwrap()).collect();
        let mut got: Vec<u16> = held
            .iter()
            .map(|l| l.local_addr().unwrap().port())
            .collect();
        got.sort_unstable();
        assert_eq!(got, [29170, 29171, 29172, 29173]);
        let err = ports.bind().unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse);
        assert!(err.to_string().contains("all 4 ports are in use"), "{err}");
        drop(held);
        // Round again from where it stopped.
        let again = ports.free().unwrap().port();
        assert!(ports.contains(again) && !ports.contains(29174));
    }
}
