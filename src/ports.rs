//! Port accounting: sockets by TCP state, TIME_WAIT per destination, and how much of
//! the ephemeral port pool each destination has used, so a failing load test can be
//! told apart from a generator that ran out of ports.
//!
//! Linux picks a local port per (local address, destination): a port in TIME_WAIT
//! towards one destination can still be used towards another, so the pool is per
//! destination. Sockets are read through netlink (`NETLINK_SOCK_DIAG`, the interface
//! `ss` uses: one dump per address family, fast at tens of thousands of sockets), or,
//! where netlink is refused, from `/proc/net/tcp` and `/proc/net/tcp6`.

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
};

use serde::Serialize;

/// Why accounting failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file under /proc could not be read.
    #[error("{path}: {why}")]
    Read {
        /// The file.
        path: String,
        /// What the OS said (in the message, so not also a source to print twice).
        why: std::io::Error,
    },
    /// A line did not parse.
    #[error("{path}:{line}: {why}")]
    Parse {
        /// The file.
        path: String,
        /// 1-based line.
        line: usize,
        /// What was wrong.
        why: String,
    },
}

/// A TCP socket as the kernel lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Socket {
    /// Its state, e.g. `TIME_WAIT`.
    pub state: &'static str,
    /// Local address and port.
    pub local: SocketAddr,
    /// Remote address and port (0 for listeners).
    pub remote: SocketAddr,
}

/// The kernel's TCP states, by their number in /proc/net/tcp.
const STATES: [&str; 12] = [
    "UNKNOWN",
    "ESTABLISHED",
    "SYN_SENT",
    "SYN_RECV",
    "FIN_WAIT1",
    "FIN_WAIT2",
    "TIME_WAIT",
    "CLOSE",
    "CLOSE_WAIT",
    "LAST_ACK",
    "LISTEN",
    "CLOSING",
];

/// Every TCP socket of this network namespace, IPv4 and IPv6: through netlink, or
/// /proc when netlink is not available.
pub fn sockets() -> Result<Vec<Socket>, Error> {
    match netlink::sockets() {
        Ok(sockets) => Ok(sockets),
        Err(err) => {
            tracing::debug!(%err, "sock_diag unavailable; reading /proc/net/tcp");
            proc_sockets()
        }
    }
}

/// Which socket table [`sockets`] reads: the kernel's boot and this process's
/// network namespace, e.g. `3f5c…/net:[4026531840]`. Two processes with the same
/// one count the same sockets (two load generators on one machine, whatever
/// host names they were given); `None` where /proc does not say.
pub fn socket_table() -> Option<String> {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let netns = std::fs::read_link("/proc/self/ns/net").ok()?;
    Some(format!("{}/{}", boot.trim(), netns.display()))
}

/// Every TCP socket, from /proc/net/tcp and /proc/net/tcp6.
pub fn proc_sockets() -> Result<Vec<Socket>, Error> {
    let mut out = Vec::new();
    for path in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            // A kernel without IPv6 has no tcp6 table: no IPv6 sockets.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && path.ends_with('6') => continue,
            Err(why) => {
                return Err(Error::Read {
                    path: path.into(),
                    why,
                });
            }
        };
        for (i, line) in text.lines().enumerate().skip(1) {
            let parse = || -> Result<Socket, String> {
                let mut fields = line.split_whitespace().skip(1);
                let local = address(fields.next().ok_or("no local address")?)?;
                let remote = address(fields.next().ok_or("no remote address")?)?;
                let state = u8::from_str_radix(fields.next().ok_or("no state")?, 16)
                    .map_err(|e| e.to_string())?;
                Ok(Socket {
                    state: STATES.get(state as usize).copied().unwrap_or("UNKNOWN"),
                    local,
                    remote,
                })
            };
            out.push(parse().map_err(|why| Error::Parse {
                path: path.into(),
                line: i + 1,
                why,
            })?);
        }
    }
    Ok(out)
}

/// `0100007F:1F90` (IPv4) or 32 hex digits and a port (IPv6), as /proc writes them:
/// each 32-bit word of the address printed as a host-order (little-endian) number.
fn address(text: &str) -> Result<SocketAddr, String> {
    let (ip, port) = text
        .split_once(':')
        .ok_or_else(|| format!("`{text}` has no port"))?;
    let port = u16::from_str_radix(port, 16).map_err(|e| format!("port `{port}`: {e}"))?;
    let words = (0..ip.len() / 8)
        .map(|i| {
            ip.get(8 * i..8 * i + 8)
                .and_then(|w| u32::from_str_radix(w, 16).ok())
        })
        .collect::<Option<Vec<u32>>>()
        .ok_or_else(|| format!("address `{ip}` is not hex"))?;
    let bytes: Vec<u8> = words.into_iter().flat_map(u32::to_le_bytes).collect();
    let ip = match <[u8; 4]>::try_from(bytes.as_slice()) {
        Ok(v4) if ip.len() == 8 => IpAddr::V4(Ipv4Addr::from(v4)),
        _ => match <[u8; 16]>::try_from(bytes.as_slice()) {
            Ok(v6) if ip.len() == 32 => {
                let v6 = Ipv6Addr::from(v6);
                v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
            }
            _ => return Err(format!("address `{ip}` is neither 8 nor 32 hex digits")),
        },
    };
    Ok(SocketAddr::new(ip, port))
}

/// The sock_diag dump: what `ss -tan` reads.
pub mod netlink {
    use std::{
        io,
        net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
        os::fd::AsRawFd,
    };

    use nix::sys::socket::{
        AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, recv, sendto,
        socket,
    };

    use super::{STATES, Socket};

    const SOCK_DIAG_BY_FAMILY: u16 = 20;
    const NLM_F_REQUEST: u16 = 0x1;
    const NLM_F_DUMP: u16 = 0x300;
    const NLMSG_ERROR: u16 = 2;
    const NLMSG_DONE: u16 = 3;
    const AF_INET: u8 = 2;
    const AF_INET6: u8 = 10;
    const IPPROTO_TCP: u8 = 6;

    /// Every TCP socket, both families, by one dump each.
    pub fn sockets() -> io::Result<Vec<Socket>> {
        let mut out = Vec::new();
        for family in [AF_INET, AF_INET6] {
            dump(family, &mut out)?;
        }
        Ok(out)
    }

    fn dump(family: u8, out: &mut Vec<Socket>) -> io::Result<()> {
        let fd = socket(
            AddressFamily::Netlink,
            SockType::Datagram,
            SockFlag::SOCK_CLOEXEC,
            SockProtocol::NetlinkSockDiag,
        )?;
        // nlmsghdr, then inet_diag_req_v2 asking for every state.
        let mut req = Vec::with_capacity(72);
        req.extend_from_slice(&72u32.to_ne_bytes());
        req.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
        req.extend_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
        req.extend_from_slice(&1u32.to_ne_bytes()); // sequence
        req.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel
        req.extend_from_slice(&[family, IPPROTO_TCP, 0, 0]);
        req.extend_from_slice(&0xfffu32.to_ne_bytes()); // every TCP state
        req.extend_from_slice(&[0; 48]); // inet_diag_sockid: no filter
        sendto(
            fd.as_raw_fd(),
            &req,
            &NetlinkAddr::new(0, 0),
            MsgFlags::empty(),
        )?;
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n = recv(fd.as_raw_fd(), &mut buf, MsgFlags::empty())?;
            let mut at = 0;
            while at + 16 <= n {
                let word =
                    |i: usize| u32::from_ne_bytes(buf[i..i + 4].try_into().expect("four bytes"));
                let len = word(at) as usize;
                let kind = u16::from_ne_bytes([buf[at + 4], buf[at + 5]]);
                if len < 16 || at + len > n {
                    return Err(io::Error::other("sock_diag: a truncated message"));
                }
                match kind {
                    NLMSG_DONE => return Ok(()),
                    NLMSG_ERROR => {
                        let errno = i32::from_ne_bytes(
                            buf[at + 16..at + 20].try_into().expect("four bytes"),
                        );
                        return Err(io::Error::from_raw_os_error(-errno));
                    }
                    _ => {
                        if let Some(socket) = message(&buf[at + 16..at + len]) {
                            out.push(socket);
                        }
                    }
                }
                at += (len + 3) & !3;
            }
        }
    }

    /// One inet_diag_msg: family, state, timer, retransmits, then the socket id with
    /// ports and addresses in network order.
    fn message(m: &[u8]) -> Option<Socket> {
        if m.len() < 52 {
            return None;
        }
        let port = |i: usize| u16::from_be_bytes([m[i], m[i + 1]]);
        let ip = |i: usize| -> IpAddr {
            if m[0] == AF_INET {
                IpAddr::V4(Ipv4Addr::new(m[i], m[i + 1], m[i + 2], m[i + 3]))
            } else {
                let v6 =
                    Ipv6Addr::from(<[u8; 16]>::try_from(&m[i..i + 16]).expect("sixteen bytes"));
                v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
            }
        };
        Some(Socket {
            state: STATES.get(usize::from(m[1])).copied().unwrap_or("UNKNOWN"),
            local: SocketAddr::new(ip(8), port(4)),
            remote: SocketAddr::new(ip(24), port(6)),
        })
    }
}

/// The kernel settings that bound the port pool.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct Limits {
    /// `net.ipv4.ip_local_port_range`, inclusive.
    pub ephemeral: (u16, u16),
    /// `net.ipv4.tcp_tw_reuse` (0 off, 1 on, 2 loopback only).
    pub tw_reuse: u8,
    /// `net.ipv4.tcp_fin_timeout`, seconds.
    pub fin_timeout: u32,
}

impl Limits {
    /// Reads them from /proc/sys.
    pub fn read() -> Result<Limits, Error> {
        let read = |path: &str| {
            std::fs::read_to_string(path).map_err(|why| Error::Read {
                path: path.into(),
                why,
            })
        };
        let range = read("/proc/sys/net/ipv4/ip_local_port_range")?;
        let mut parts = range.split_whitespace().map(str::parse::<u16>);
        let bad = |why: &str| Error::Parse {
            path: "/proc/sys/net/ipv4/ip_local_port_range".into(),
            line: 1,
            why: why.into(),
        };
        let (Some(Ok(low)), Some(Ok(high))) = (parts.next(), parts.next()) else {
            return Err(bad("not two port numbers"));
        };
        let number = |path: &str| -> Result<u32, Error> {
            read(path)?
                .trim()
                .parse()
                .map_err(|e: std::num::ParseIntError| Error::Parse {
                    path: path.into(),
                    line: 1,
                    why: e.to_string(),
                })
        };
        Ok(Limits {
            ephemeral: (low, high),
            tw_reuse: number("/proc/sys/net/ipv4/tcp_tw_reuse")? as u8,
            fin_timeout: number("/proc/sys/net/ipv4/tcp_fin_timeout")?,
        })
    }

    /// How many ephemeral ports there are.
    pub fn pool(&self) -> u32 {
        u32::from(self.ephemeral.1.saturating_sub(self.ephemeral.0)) + 1
    }
}

/// One destination's share of the pool.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Destination {
    /// Address and port connected to.
    pub dest: SocketAddr,
    /// Sockets towards it, in any state, whose local port is ephemeral.
    pub ports_in_use: usize,
    /// Of those, in TIME_WAIT.
    pub time_wait: usize,
    /// The ephemeral ports left for new connections to it.
    pub headroom: i64,
    /// `ports_in_use` as a share of the pool, percent.
    pub used_percent: f64,
}

/// What `snag ports` reports.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Report {
    /// Sockets by state.
    pub states: BTreeMap<&'static str, usize>,
    /// The kernel's limits.
    pub limits: Limits,
    /// Ephemeral ports per destination.
    pub pool: u32,
    /// Destinations by ports used, most first (or the one asked for).
    pub destinations: Vec<Destination>,
}

/// Counts `sockets` against `limits`; with `dest`, that destination alone.
pub fn report(sockets: &[Socket], limits: Limits, dest: Option<SocketAddr>) -> Report {
    let mut states = BTreeMap::new();
    let mut per_dest: BTreeMap<SocketAddr, (usize, usize)> = BTreeMap::new();
    let (low, high) = limits.ephemeral;
    for s in sockets {
        *states.entry(s.state).or_insert(0) += 1;
        let ephemeral = (low..=high).contains(&s.local.port());
        if s.state != "LISTEN" && ephemeral && dest.is_none_or(|d| d == s.remote) {
            let entry = per_dest.entry(s.remote).or_default();
            entry.0 += 1;
            if s.state == "TIME_WAIT" {
                entry.1 += 1;
            }
        }
    }
    let pool = limits.pool();
    let mut destinations: Vec<Destination> = per_dest
        .into_iter()
        .map(|(dest, (used, tw))| Destination {
            dest,
            ports_in_use: used,
            time_wait: tw,
            headroom: i64::from(pool) - used as i64,
            used_percent: (used as f64 * 1000.0 / f64::from(pool)).round() / 10.0,
        })
        .collect();
    if let (Some(d), true) = (dest, destinations.is_empty()) {
        destinations.push(Destination {
            dest: d,
            ports_in_use: 0,
            time_wait: 0,
            headroom: i64::from(pool),
            used_percent: 0.0,
        });
    }
    destinations.sort_by(|a, b| {
        b.ports_in_use
            .cmp(&a.ports_in_use)
            .then(a.dest.cmp(&b.dest))
    });
    Report {
        states,
        limits,
        pool,
        destinations,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_addresses_parse() {
        assert_eq!(
            address("0100007F:1F90").unwrap(),
            "127.0.0.1:8080".parse().unwrap()
        );
        assert_eq!(
            address("00000000000000000000000001000000:0050").unwrap(),
            "[::1]:80".parse().unwrap()
        );
        assert_eq!(
            address("0000000000000000FFFF00000100007F:01BB").unwrap(),
            "127.0.0.1:443".parse().unwrap()
        );
        assert!(address("XYZ:1").is_err());
    }

    #[test]
    fn the_pool_is_counted_per_destination() {
        let limits = Limits {
            ephemeral: (32768, 32777),
            tw_reuse: 2,
            fin_timeout: 60,
        };
        let s = |state, local: &str, remote: &str| Socket {
            state,
            local: local.parse().unwrap(),
            remote: remote.parse().unwrap(),
        };
        let sockets = [
            s("TIME_WAIT", "127.0.0.1:32768", "127.0.0.1:80"),
            s("TIME_WAIT", "127.0.0.1:32769", "127.0.0.1:80"),
            s("ESTABLISHED", "127.0.0.1:32768", "127.0.0.1:81"),
            s("ESTABLISHED", "127.0.0.1:80", "127.0.0.1:40000"), // not ephemeral
            s("LISTEN", "127.0.0.1:80", "0.0.0.0:0"),
        ];
        let r = report(&sockets, limits, None);
        assert_eq!(
            (r.pool, r.states["TIME_WAIT"], r.states["LISTEN"]),
            (10, 2, 1)
        );
        let first = &r.destinations[0];
        assert_eq!(
            (
                first.dest.port(),
                first.ports_in_use,
                first.time_wait,
                first.headroom
            ),
            (80, 2, 2, 8)
        );
        assert_eq!(r.destinations.len(), 2);
    }
}
