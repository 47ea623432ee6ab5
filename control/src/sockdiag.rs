//! Bytes sent by this host's TCP sockets, from the kernel's socket table (NETLINK_SOCK_DIAG,
//! `inet_diag` with `tcp_info`, what `ss -ti` reads): the flow table keeps no byte count, so
//! `paceline flows` takes a TCP flow's bytes from its socket. The requests and replies are a
//! few fixed-layout kernel structs (`linux/inet_diag.h`), written and read here by offset.

use std::{collections::HashMap, net::IpAddr};

use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_SOCK_DIAG};

use crate::flows::FlowRow;

const SOCK_DIAG_BY_FAMILY: u16 = 20;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_DUMP: u16 = 0x300;
const INET_DIAG_INFO: u16 = 2;
/// `tcp_info.tcpi_bytes_acked` (Linux 4.1) and `tcpi_bytes_sent` (4.19).
const TCPI_BYTES_ACKED: usize = 120;
const TCPI_BYTES_SENT: usize = 200;

type Tuple = (IpAddr, u16, IpAddr, u16);

fn ip(family: u8, b: &[u8]) -> IpAddr {
    if family == libc::AF_INET as u8 {
        IpAddr::from([b[0], b[1], b[2], b[3]])
    } else {
        let v6 = std::net::Ipv6Addr::from(<[u8; 16]>::try_from(&b[..16]).expect("16 bytes"));
        v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(IpAddr::V6(v6))
    }
}

/// Every TCP socket of this network namespace: (local, local port, remote, remote port) ->
/// bytes sent.
pub fn tcp_bytes() -> std::io::Result<HashMap<Tuple, u64>> {
    let mut sock = Socket::new(NETLINK_SOCK_DIAG)?;
    sock.bind_auto()?;
    sock.connect(&SocketAddr::new(0, 0))?;
    let mut out = HashMap::new();
    for family in [libc::AF_INET as u8, libc::AF_INET6 as u8] {
        let mut req = vec![0u8; 16 + 56];
        let len = req.len() as u32;
        req[0..4].copy_from_slice(&len.to_ne_bytes());
        req[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
        req[6..8].copy_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
        req[8..12].copy_from_slice(&1u32.to_ne_bytes());
        req[16] = family;
        req[17] = libc::IPPROTO_TCP as u8;
        req[18] = 1 << (INET_DIAG_INFO - 1);
        req[20..24].copy_from_slice(&u32::MAX.to_ne_bytes());
        sock.send(&req, 0)?;
        let mut buf = vec![0u8; 64 * 1024];
        'recv: loop {
            let n = sock.recv(&mut &mut buf[..], 0)?;
            let mut off = 0;
            while off + 16 <= n {
                let mlen = u32::from_ne_bytes(buf[off..off + 4].try_into().expect("4")) as usize;
                let mtype = u16::from_ne_bytes(buf[off + 4..off + 6].try_into().expect("2"));
                if mlen < 16 || off + mlen > n {
                    break 'recv;
                }
                match mtype {
                    NLMSG_DONE | NLMSG_ERROR => break 'recv,
                    SOCK_DIAG_BY_FAMILY => {
                        let m = &buf[off + 16..off + mlen];
                        if let Some((t, bytes)) = parse(m) {
                            out.insert(t, bytes);
                        }
                    }
                    _ => {}
                }
                off += (mlen + 3) & !3;
            }
            if n == 0 {
                break;
            }
        }
    }
    Ok(out)
}

/// One `inet_diag_msg` and its attributes.
fn parse(m: &[u8]) -> Option<(Tuple, u64)> {
    if m.len() < 72 {
        return None;
    }
    let family = m[0];
    let sport = u16::from_be_bytes([m[4], m[5]]);
    let dport = u16::from_be_bytes([m[6], m[7]]);
    let src = ip(family, &m[8..24]);
    let dst = ip(family, &m[24..40]);
    let mut off = 72;
    while off + 4 <= m.len() {
        let alen = u16::from_ne_bytes([m[off], m[off + 1]]) as usize;
        let atype = u16::from_ne_bytes([m[off + 2], m[off + 3]]);
        if alen < 4 || off + alen > m.len() {
            break;
        }
        if atype == INET_DIAG_INFO {
            let info = &m[off + 4..off + alen];
            let at = |o: usize| {
                info.get(o..o + 8)
                    .map(|b| u64::from_ne_bytes(b.try_into().expect("8")))
            };
            let bytes = at(TCPI_BYTES_SENT).or_else(|| at(TCPI_BYTES_ACKED))?;
            return Some(((src, sport, dst, dport), bytes));
        }
        off += (alen + 3) & !3;
    }
    None
}

/// Fills in the bytes of the TCP rows whose socket is found.
pub fn fill_bytes(rows: &mut [FlowRow]) {
    if !rows.iter().any(|r| r.proto == "tcp") {
        return;
    }
    let Ok(table) = tcp_bytes() else { return };
    let split = |s: &str| -> Option<(IpAddr, u16)> {
        let a: std::net::SocketAddr = s.parse().ok()?;
        Some((a.ip(), a.port()))
    };
    for r in rows.iter_mut().filter(|r| r.proto == "tcp") {
        if let (Some((s, sp)), Some((d, dp))) = (split(&r.src), split(&r.dst)) {
            r.bytes = table.get(&(s, sp, d, dp)).copied();
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn finds_a_connected_socket_and_its_bytes() {
        use std::io::Write as _;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (_s, _) = l.accept().unwrap();
        c.write_all(&[7u8; 5000]).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        let t = super::tcp_bytes().unwrap();
        let key = (
            c.local_addr().unwrap().ip(),
            c.local_addr().unwrap().port(),
            c.peer_addr().unwrap().ip(),
            c.peer_addr().unwrap().port(),
        );
        assert_eq!(t.get(&key).copied(), Some(5000), "{key:?} in {t:?}");
    }
}
