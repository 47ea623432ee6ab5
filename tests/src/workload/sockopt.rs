//! Per-socket options shared by all clients (congestion control, pacing rate, mark, TOS/DSCP,
//! priority), socket creation with the options applied before `connect`, and `TCP_INFO`.

use serde::{Deserialize, Serialize};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use std::io;
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::Duration;

/// Options applied to every socket a client opens (before `connect`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, clap::Args)]
pub struct SockOpts {
    /// TCP congestion control of the socket (`TCP_CONGESTION`), e.g. cubic, reno, bbr.
    #[arg(long)]
    pub cc: Option<String>,
    /// `SO_MAX_PACING_RATE` in bits per second (TCP paces itself without fq since 4.20).
    #[arg(long)]
    pub pacing_rate_bps: Option<u64>,
    /// `SO_MARK` (skb->mark).
    #[arg(long)]
    pub mark: Option<u32>,
    /// The whole TOS / traffic-class byte (`IP_TOS`, `IPV6_TCLASS`).
    #[arg(long, conflicts_with = "dscp")]
    pub tos: Option<u8>,
    /// DSCP (0-63); sets TOS = DSCP << 2.
    #[arg(long)]
    pub dscp: Option<u8>,
    /// `SO_PRIORITY` (skb->priority).
    #[arg(long)]
    pub priority: Option<u32>,
    /// `TCP_NODELAY` (request/response clients set it regardless).
    #[arg(long)]
    pub nodelay: bool,
}

fn setsockopt_raw<T>(fd: i32, level: i32, name: i32, val: &T) -> io::Result<()> {
    // SAFETY: val points to a live T of the given size.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (val as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

impl SockOpts {
    /// The TOS byte these options ask for, if any.
    pub fn tos_byte(&self) -> Option<u8> {
        self.tos.or(self.dscp.map(|d| (d & 0x3f) << 2))
    }

    /// Applies the options to `s` (`v6`: the socket is IPv6; `tcp`: a TCP socket).
    pub fn apply(&self, s: &Socket, v6: bool, tcp: bool) -> io::Result<()> {
        let ctx = |what: &str, e: io::Error| io::Error::new(e.kind(), format!("{what}: {e}"));
        if tcp {
            if let Some(cc) = &self.cc {
                s.set_tcp_congestion(cc.as_bytes())
                    .map_err(|e| ctx(&format!("TCP_CONGESTION {cc}"), e))?;
            }
            if self.nodelay {
                s.set_tcp_nodelay(true)?;
            }
        }
        if let Some(r) = self.pacing_rate_bps {
            let bytes = r / 8;
            let fd = s.as_raw_fd();
            // The kernel takes a u32 and, since 5.x, a u64.
            let res = if bytes <= u32::MAX as u64 {
                setsockopt_raw(fd, libc::SOL_SOCKET, libc::SO_MAX_PACING_RATE, &(bytes as u32))
            } else {
                setsockopt_raw(fd, libc::SOL_SOCKET, libc::SO_MAX_PACING_RATE, &bytes)
            };
            res.map_err(|e| ctx("SO_MAX_PACING_RATE", e))?;
        }
        if let Some(m) = self.mark {
            s.set_mark(m).map_err(|e| ctx("SO_MARK", e))?;
        }
        if let Some(t) = self.tos_byte() {
            if v6 {
                setsockopt_raw(
                    s.as_raw_fd(),
                    libc::IPPROTO_IPV6,
                    libc::IPV6_TCLASS,
                    &(t as libc::c_int),
                )
                .map_err(|e| ctx("IPV6_TCLASS", e))?;
            } else {
                s.set_tos_v4(t as u32).map_err(|e| ctx("IP_TOS", e))?;
            }
        }
        if let Some(p) = self.priority {
            s.set_priority(p).map_err(|e| ctx("SO_PRIORITY", e))?;
        }
        Ok(())
    }
}

/// Opens a TCP connection to `to` with `opts` applied before `connect` (so the congestion
/// control and marks hold from the SYN on). `connect_timeout` bounds each handshake; a refused
/// connection is retried for up to 3 s (the server may still be starting).
pub fn connect_tcp(to: SocketAddr, opts: &SockOpts, connect_timeout: Duration) -> io::Result<TcpStream> {
    let give_up = std::time::Instant::now() + Duration::from_secs(3);
    loop {
        let s = Socket::new(Domain::for_address(to), Type::STREAM, Some(Protocol::TCP))?;
        opts.apply(&s, to.is_ipv6(), true)?;
        match s.connect_timeout(&SockAddr::from(to), connect_timeout) {
            Ok(()) => return Ok(s.into()),
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused && std::time::Instant::now() < give_up => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(io::Error::new(e.kind(), format!("connect {to}: {e}"))),
        }
    }
}

/// Opens a UDP socket connected to `to` with `opts` applied.
pub fn connect_udp(to: SocketAddr, opts: &SockOpts) -> io::Result<UdpSocket> {
    let s = unconnected_udp(to, opts)?;
    s.connect(to)
        .map_err(|e| io::Error::new(e.kind(), format!("connect {to}: {e}")))?;
    Ok(s)
}

/// Opens a UDP socket of `to`'s family with `opts` applied, bound to any address and not
/// connected (its datagrams go out with `send_to`).
pub fn unconnected_udp(to: SocketAddr, opts: &SockOpts) -> io::Result<UdpSocket> {
    let s = Socket::new(Domain::for_address(to), Type::DGRAM, Some(Protocol::UDP))?;
    opts.apply(&s, to.is_ipv6(), false)?;
    let any: SocketAddr = if to.is_ipv6() {
        "[::]:0".parse().unwrap()
    } else {
        "0.0.0.0:0".parse().unwrap()
    };
    s.bind(&SockAddr::from(any))?;
    Ok(s.into())
}

/// Selected `TCP_INFO` fields of a connection.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TcpInfo {
    /// Smoothed RTT (us).
    pub rtt_us: u32,
    /// RTT variance (us).
    pub rttvar_us: u32,
    /// Congestion window (segments).
    pub snd_cwnd: u32,
    /// Retransmitted segments over the connection's life.
    pub total_retrans: u32,
    /// Segments currently considered lost.
    pub lost: u32,
    /// Delivery rate estimate (bit/s).
    pub delivery_rate_bps: u64,
    /// Current pacing rate (bit/s; u64::MAX*8 saturates when unpaced).
    pub pacing_rate_bps: u64,
    /// `SO_MAX_PACING_RATE` (bytes/s of payload; u64::MAX when unlimited).
    #[serde(default)]
    pub max_pacing_rate: u64,
    /// Bytes acknowledged over the connection's life.
    #[serde(default)]
    pub bytes_acked: u64,
    /// The MSS the connection sends with.
    #[serde(default)]
    pub snd_mss: u32,
}

/// Reads `TCP_INFO` of a connected TCP socket.
pub fn tcp_info(fd: i32) -> io::Result<TcpInfo> {
    // The fixed prefix of struct tcp_info that every kernel since 4.9 fills; read into a
    // zeroed buffer and pick fields by offset (stable UAPI layout).
    let mut buf = [0u8; 232];
    let mut len = buf.len() as libc::socklen_t;
    // SAFETY: buf is writable for len bytes.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            buf.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    let u32_at = |o: usize| u32::from_ne_bytes(buf[o..o + 4].try_into().unwrap());
    let u64_at = |o: usize| u64::from_ne_bytes(buf[o..o + 8].try_into().unwrap());
    // Offsets in struct tcp_info (include/uapi/linux/tcp.h): 8 u8 fields, then u32s from
    // offset 8: rto 8, ato 12, snd_mss 16, rcv_mss 20, unacked 24, sacked 28, lost 32,
    // retrans 36, fackets 40, last_data_sent 44, last_ack_sent 48, last_data_recv 52,
    // last_ack_recv 56, pmtu 60, rcv_ssthresh 64, rtt 68, rttvar 72, snd_ssthresh 76,
    // snd_cwnd 80, advmss 84, reordering 88, rcv_rtt 92, rcv_space 96, total_retrans 100,
    // pacing_rate u64 104, max_pacing_rate 112, bytes_acked 120, bytes_received 128,
    // segs_out 136, segs_in 140, notsent_bytes 144, min_rtt 148, data_segs_in 152,
    // data_segs_out 156, delivery_rate u64 160.
    let got = len as usize;
    let pacing = if got >= 112 { u64_at(104) } else { 0 };
    let delivery = if got >= 168 { u64_at(160) } else { 0 };
    Ok(TcpInfo {
        rtt_us: u32_at(68),
        rttvar_us: u32_at(72),
        snd_cwnd: u32_at(80),
        total_retrans: u32_at(100),
        lost: u32_at(32),
        delivery_rate_bps: delivery.saturating_mul(8),
        pacing_rate_bps: pacing.saturating_mul(8),
        max_pacing_rate: if got >= 120 { u64_at(112) } else { 0 },
        bytes_acked: if got >= 128 { u64_at(120) } else { 0 },
        snd_mss: u32_at(16),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tos_from_dscp() {
        let o = SockOpts {
            dscp: Some(46),
            ..Default::default()
        };
        assert_eq!(o.tos_byte(), Some(184));
        let o = SockOpts {
            tos: Some(0x10),
            ..Default::default()
        };
        assert_eq!(o.tos_byte(), Some(0x10));
        assert_eq!(SockOpts::default().tos_byte(), None);
    }

    #[test]
    fn tcp_info_on_loopback() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = connect_tcp(
            l.local_addr().unwrap(),
            &SockOpts {
                cc: Some("reno".into()),
                ..Default::default()
            },
            Duration::from_secs(2),
        )
        .unwrap();
        let info = tcp_info(c.as_raw_fd()).unwrap();
        assert!(info.snd_cwnd > 0, "{info:?}");
    }
}
