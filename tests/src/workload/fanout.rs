//! One fan-out round, shared by partition-aggregate and incast: send one request on each of N
//! connections, then read all N responses with a single `poll` loop, timestamping each
//! connection's last byte (one thread, so 2 cores are not crowded by N reader threads).

use super::sockopt::{self, SockOpts};
use super::{mono_ns, proto};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::time::Duration;

/// Persistent connections to the servers of a fan-out workload.
pub struct Fanout {
    conns: Vec<TcpStream>,
    addrs: Vec<SocketAddr>,
    scratch: Vec<u8>,
}

/// Timing of one response.
#[derive(Clone, Copy, Debug, Default)]
pub struct Timing {
    pub send_ns: u64,
    pub done_ns: u64,
}

impl Fanout {
    /// Connects to every address (options applied before connect).
    pub fn connect(addrs: &[SocketAddr], opts: &SockOpts) -> io::Result<Fanout> {
        let mut conns = Vec::with_capacity(addrs.len());
        for &a in addrs {
            let s = sockopt::connect_tcp(a, opts, Duration::from_secs(10))?;
            s.set_nodelay(true)?;
            conns.push(s);
        }
        Ok(Fanout {
            conns,
            addrs: addrs.to_vec(),
            scratch: vec![0u8; 256 * 1024],
        })
    }

    /// Number of connections.
    pub fn len(&self) -> usize {
        self.conns.len()
    }

    /// No connection.
    pub fn is_empty(&self) -> bool {
        self.conns.is_empty()
    }

    /// Sends `reqs[i]` on connection i (all back to back) and waits for every response.
    /// Errors if a connection fails or `timeout` passes first.
    pub fn round(&mut self, reqs: &[proto::Request], timeout: Duration) -> io::Result<Vec<Timing>> {
        assert_eq!(reqs.len(), self.conns.len());
        let n = reqs.len();
        let mut t = vec![Timing::default(); n];
        for (i, r) in reqs.iter().enumerate() {
            self.conns[i].set_nonblocking(false)?;
            t[i].send_ns = mono_ns();
            let mut enc = r.encode();
            enc[16..24].copy_from_slice(&t[i].send_ns.to_le_bytes());
            self.conns[i].write_all(&enc)?;
            // (req_len is the header size: nothing more to send.)
        }
        let mut left: Vec<u64> = reqs
            .iter()
            .map(|r| r.resp_len.max(proto::RESP_HDR as u64))
            .collect();
        let mut hdr = vec![[0u8; proto::RESP_HDR]; n];
        let mut got = vec![0u64; n];
        for c in &self.conns {
            c.set_nonblocking(true)?;
        }
        let end = mono_ns() + timeout.as_nanos() as u64;
        let mut pending = n;
        let mut pfds: Vec<libc::pollfd> = Vec::with_capacity(n);
        let mut idx: Vec<usize> = Vec::with_capacity(n);
        while pending > 0 {
            pfds.clear();
            idx.clear();
            for (i, c) in self.conns.iter().enumerate() {
                if left[i] > 0 {
                    pfds.push(libc::pollfd {
                        fd: c.as_raw_fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    });
                    idx.push(i);
                }
            }
            let now = mono_ns();
            if now >= end {
                let missing: Vec<String> = (0..n)
                    .filter(|&i| left[i] > 0)
                    .map(|i| self.addrs[i].to_string())
                    .collect();
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("responses missing after {timeout:?} from {}", missing.join(", ")),
                ));
            }
            let ms = ((end - now) / 1_000_000).clamp(1, 1000) as i32;
            // SAFETY: pfds is a valid array of pollfd.
            let r = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, ms) };
            if r < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            for (k, p) in pfds.iter().enumerate() {
                if p.revents == 0 {
                    continue;
                }
                let i = idx[k];
                loop {
                    let want = (left[i] as usize).min(self.scratch.len());
                    match self.conns[i].read(&mut self.scratch[..want]) {
                        Ok(0) => {
                            return Err(io::Error::new(
                                io::ErrorKind::UnexpectedEof,
                                format!("{} closed mid-response", self.addrs[i]),
                            ));
                        }
                        Ok(m) => {
                            if got[i] < proto::RESP_HDR as u64 {
                                let h0 = got[i] as usize;
                                let take = (proto::RESP_HDR - h0).min(m);
                                hdr[i][h0..h0 + take].copy_from_slice(&self.scratch[..take]);
                            }
                            got[i] += m as u64;
                            left[i] -= m as u64;
                            if left[i] == 0 {
                                t[i].done_ns = mono_ns();
                                pending -= 1;
                                let (id, _) = proto::decode_resp_header(&hdr[i])?;
                                if id != reqs[i].id {
                                    return Err(io::Error::new(
                                        io::ErrorKind::InvalidData,
                                        format!(
                                            "{}: response id {id}, expected {}",
                                            self.addrs[i], reqs[i].id
                                        ),
                                    ));
                                }
                                break;
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => {
                            return Err(io::Error::new(e.kind(), format!("{}: {e}", self.addrs[i])));
                        }
                    }
                }
            }
        }
        Ok(t)
    }
}
