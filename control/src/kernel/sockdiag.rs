//! This host's TCP and connected UDP sockets, from the kernel's socket table
//! (NETLINK_SOCK_DIAG, `inet_diag` with `tcp_info` for TCP, what `ss -ti` and `ss -u` read): a
//! local socket that is one flow (TCP, connected UDP) keeps its clock in socket storage, not in
//! the flow table, and nothing in the datapath counts a flow's bytes, so `paceline flows` shows
//! such sockets from here, TCP's with their bytes and the kernel's pacing rate. The requests
//! and replies are a few fixed-layout kernel structs (`linux/inet_diag.h`), written and read
//! here by offset.

use std::{
    collections::HashMap,
    net::IpAddr,
    os::fd::{AsRawFd as _, BorrowedFd},
};

use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_SOCK_DIAG};
use paceline_common::maps::SockState;

use crate::flows::FlowRow;

const SOCK_DIAG_BY_FAMILY: u16 = 20;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_DUMP: u16 = 0x300;
const INET_DIAG_INFO: u16 = 2;
/// Request: the socket storage maps whose values to dump (`linux/inet_diag.h`, Linux 5.2),
/// each a `SK_DIAG_BPF_STORAGE_REQ_MAP_FD` (`linux/sock_diag.h`).
const INET_DIAG_REQ_SK_BPF_STORAGES: u16 = 2;
const SK_DIAG_BPF_STORAGE_REQ_MAP_FD: u16 = 1;
/// Reply: the values, each a nested `SK_DIAG_BPF_STORAGE` of a map id and the value.
const INET_DIAG_SK_BPF_STORAGES: u16 = 20;
const SK_DIAG_BPF_STORAGE: u16 = 1;
const SK_DIAG_BPF_STORAGE_MAP_VALUE: u16 = 3;
const NLA_F_NESTED: u16 = 1 << 15;
const NLA_TYPE_MASK: u16 = !(NLA_F_NESTED | 1 << 14);
/// `tcp_info.tcpi_pacing_rate` (bytes/s), `tcpi_bytes_acked` (Linux 4.1) and `tcpi_bytes_sent`
/// (4.19).
const TCPI_PACING_RATE: usize = 104;
const TCPI_BYTES_ACKED: usize = 120;
const TCPI_BYTES_SENT: usize = 200;
/// `inet_diag_msg.idiag_state` of an established connection.
const TCP_ESTABLISHED: u8 = 1;

/// What the kernel says of one TCP or UDP socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SockInfo {
    /// Bytes sent (TCP's `tcp_info`; UDP reports none).
    pub bytes_sent: Option<u64>,
    /// The socket's pacing rate (bytes/s; `u64::MAX`: not paced).
    pub pacing_rate: u64,
    pub established: bool,
    /// What the tc program keeps for the socket (its class, clock and binding), when the dump
    /// was asked for the socket storage map and the socket has a value in it.
    pub storage: Option<SockState>,
}

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
/// what the kernel says of it.
pub fn tcp_sockets() -> std::io::Result<HashMap<Tuple, SockInfo>> {
    tcp_sockets_with(None)
}

/// [`tcp_sockets`], with each socket's value in the socket storage map `storage` (the kernel
/// dumps it only to a caller with CAP_BPF or CAP_SYS_ADMIN; without, the sockets come without
/// it).
pub fn tcp_sockets_with(storage: Option<BorrowedFd<'_>>) -> std::io::Result<HashMap<Tuple, SockInfo>> {
    match (storage, dump(Proto::Tcp, storage)) {
        (Some(_), Err(e)) if e.raw_os_error() == Some(libc::EPERM) => dump(Proto::Tcp, None),
        (_, r) => r,
    }
}

/// Every connected UDP socket of this network namespace (the kernel answers for UDP with
/// `udp_diag`, built in or loaded on demand). Without their socket storage: the kernel dumps
/// it with TCP sockets only (`inet_sk_diag_fill` adds it after the connection-socket part).
pub fn udp_sockets() -> std::io::Result<HashMap<Tuple, SockInfo>> {
    dump(Proto::Udp, None)
}

/// Which socket table a dump reads.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Proto {
    Tcp,
    Udp,
}

fn dump(proto: Proto, storage: Option<BorrowedFd<'_>>) -> std::io::Result<HashMap<Tuple, SockInfo>> {
    let mut sock = Socket::new(NETLINK_SOCK_DIAG)?;
    sock.bind_auto()?;
    sock.connect(&SocketAddr::new(0, 0))?;
    let mut out = HashMap::new();
    for family in [libc::AF_INET as u8, libc::AF_INET6 as u8] {
        let mut req = vec![0u8; 16 + 56];
        if let Some(fd) = storage {
            // One nested attribute holding one map fd.
            req.extend_from_slice(&12u16.to_ne_bytes());
            req.extend_from_slice(&(INET_DIAG_REQ_SK_BPF_STORAGES | NLA_F_NESTED).to_ne_bytes());
            req.extend_from_slice(&8u16.to_ne_bytes());
            req.extend_from_slice(&SK_DIAG_BPF_STORAGE_REQ_MAP_FD.to_ne_bytes());
            req.extend_from_slice(&(fd.as_raw_fd() as u32).to_ne_bytes());
        }
        let len = req.len() as u32;
        req[0..4].copy_from_slice(&len.to_ne_bytes());
        req[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
        req[6..8].copy_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
        req[8..12].copy_from_slice(&1u32.to_ne_bytes());
        req[16] = family;
        match proto {
            Proto::Tcp => {
                req[17] = libc::IPPROTO_TCP as u8;
                req[18] = 1 << (INET_DIAG_INFO - 1);
                req[20..24].copy_from_slice(&u32::MAX.to_ne_bytes());
            }
            Proto::Udp => {
                // Connected sockets only: an unconnected one is no flow.
                req[17] = libc::IPPROTO_UDP as u8;
                req[20..24].copy_from_slice(&(1u32 << TCP_ESTABLISHED).to_ne_bytes());
            }
        }
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
                    NLMSG_ERROR => {
                        // struct nlmsgerr: a negative errno first (0: an acknowledgement).
                        let err = buf
                            .get(off + 16..off + 20)
                            .map_or(0, |b| i32::from_ne_bytes(b.try_into().expect("4")));
                        if err < 0 {
                            return Err(std::io::Error::from_raw_os_error(-err));
                        }
                        break 'recv;
                    }
                    NLMSG_DONE => break 'recv,
                    SOCK_DIAG_BY_FAMILY => {
                        let m = &buf[off + 16..off + mlen];
                        if let Some((t, bytes)) = parse(m, proto) {
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

/// One `inet_diag_msg` and its attributes (a TCP socket's must hold its `tcp_info`).
fn parse(m: &[u8], proto: Proto) -> Option<(Tuple, SockInfo)> {
    if m.len() < 72 {
        return None;
    }
    let family = m[0];
    let established = m[1] == TCP_ESTABLISHED;
    let sport = u16::from_be_bytes([m[4], m[5]]);
    let dport = u16::from_be_bytes([m[6], m[7]]);
    let src = ip(family, &m[8..24]);
    let dst = ip(family, &m[24..40]);
    let mut info = None;
    let mut storage = None;
    for (atype, a) in attrs(&m[72..]) {
        match atype {
            INET_DIAG_INFO => {
                let at = |o: usize| {
                    a.get(o..o + 8)
                        .map(|b| u64::from_ne_bytes(b.try_into().expect("8")))
                };
                let bytes_sent = at(TCPI_BYTES_SENT).or_else(|| at(TCPI_BYTES_ACKED))?;
                let pacing_rate = at(TCPI_PACING_RATE).unwrap_or(u64::MAX);
                info = Some((bytes_sent, pacing_rate));
            }
            INET_DIAG_SK_BPF_STORAGES => storage = sock_state(a),
            _ => {}
        }
    }
    let (bytes_sent, pacing_rate) = match (proto, info) {
        (Proto::Tcp, None) => return None,
        (_, Some((b, r))) => (Some(b), r),
        (Proto::Udp, None) => (None, u64::MAX),
    };
    Some((
        (src, sport, dst, dport),
        SockInfo {
            bytes_sent,
            pacing_rate,
            established,
            storage,
        },
    ))
}

/// The netlink attributes in `b`: (type without its flags, payload).
fn attrs(b: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    let mut off = 0;
    std::iter::from_fn(move || {
        let h = b.get(off..off + 4)?;
        let alen = u16::from_ne_bytes([h[0], h[1]]) as usize;
        let atype = u16::from_ne_bytes([h[2], h[3]]) & NLA_TYPE_MASK;
        let payload = b.get(off + 4..off + alen.max(4))?;
        off += (alen.max(4) + 3) & !3;
        Some((atype, payload))
    })
}

/// The socket's value in the one storage map asked for, from `INET_DIAG_SK_BPF_STORAGES`.
fn sock_state(stgs: &[u8]) -> Option<SockState> {
    let (_, stg) = attrs(stgs).find(|(t, _)| *t == SK_DIAG_BPF_STORAGE)?;
    let (_, v) = attrs(stg).find(|(t, _)| *t == SK_DIAG_BPF_STORAGE_MAP_VALUE)?;
    if v.len() < size_of::<SockState>() {
        return None;
    }
    // SAFETY: the length is checked; SockState is plain integers (any bit pattern is valid).
    Some(unsafe { std::ptr::read_unaligned(v.as_ptr().cast::<SockState>()) })
}

/// The local sockets that are flows (established TCP, connected UDP) as rows: the flow table
/// has no entry for them (the tc program keeps such a socket's class and clock in socket
/// storage), so each is a row of its own: TCP's with its bytes and the pacing rate the kernel
/// applies, and from its value in the socket storage map `storage`, the limit that held its
/// last paced packet (the kernel dumps socket storage with TCP sockets only, so a UDP row
/// has no binding and its class is what its 5-tuple selects). `class_of` names the socket's
/// class from its protocol, 5-tuple and value: the class its storage caches under the policy
/// in force, else what the 5-tuple selects.
pub fn socket_rows(
    storage: Option<BorrowedFd<'_>>,
    class_of: impl Fn(u8, &Tuple, Option<&SockState>) -> String,
) -> Vec<FlowRow> {
    let ep = |ip: IpAddr, port: u16| match ip {
        IpAddr::V6(v) => format!("[{v}]:{port}"),
        ip => format!("{ip}:{port}"),
    };
    let row = |proto: u8, t: &Tuple, i: &SockInfo| FlowRow {
        proto: if proto == libc::IPPROTO_UDP as u8 {
            "udp"
        } else {
            "tcp"
        }
        .into(),
        src: ep(t.0, t.1),
        dst: ep(t.2, t.3),
        class: class_of(proto, t, i.storage.as_ref()),
        rate_bytes_per_second: (i.pacing_rate != u64::MAX && i.pacing_rate != 0).then_some(i.pacing_rate),
        d3_grant: false,
        next_departure_seconds: None,
        bytes: i.bytes_sent,
        binding: i.storage.and_then(|s| crate::flows::binding_of(s.binding)),
        source: "socket".into(),
    };
    let mut rows = Vec::new();
    if let Ok(tcp) = tcp_sockets_with(storage) {
        rows.extend(
            tcp.iter()
                .filter(|(t, i)| i.established && !t.0.is_loopback())
                .map(|(t, i)| row(libc::IPPROTO_TCP as u8, t, i)),
        );
    }
    if let Ok(udp) = udp_sockets() {
        rows.extend(
            udp.iter()
                .filter(|(t, i)| i.established && !t.0.is_loopback())
                .map(|(t, i)| row(libc::IPPROTO_UDP as u8, t, i)),
        );
    }
    rows
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
        let t = super::tcp_sockets().unwrap();
        let key = (
            c.local_addr().unwrap().ip(),
            c.local_addr().unwrap().port(),
            c.peer_addr().unwrap().ip(),
            c.peer_addr().unwrap().port(),
        );
        let info = t.get(&key).copied().unwrap_or_else(|| panic!("{key:?} in {t:?}"));
        assert_eq!(info.bytes_sent, Some(5000));
        assert!(info.established);
    }

    #[test]
    fn finds_a_connected_udp_socket_and_not_an_unconnected_one() {
        let c = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        c.connect("127.0.0.1:9").unwrap();
        let u = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let t = super::udp_sockets().unwrap();
        let key = |s: &std::net::UdpSocket, peer: std::net::SocketAddr| {
            (
                s.local_addr().unwrap().ip(),
                s.local_addr().unwrap().port(),
                peer.ip(),
                peer.port(),
            )
        };
        let info = t
            .get(&key(&c, c.peer_addr().unwrap()))
            .copied()
            .unwrap_or_else(|| panic!("the connected socket is not in {t:?}"));
        assert!(info.established);
        assert_eq!(info.bytes_sent, None);
        let port = u.local_addr().unwrap().port();
        assert!(!t.keys().any(|k| k.1 == port), "{t:?}");
    }
}
