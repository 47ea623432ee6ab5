//! Qdisc statistics and tc filters over rtnetlink (RTM_GETQDISC, RTM_GETTFILTER), cheap enough
//! to read every millisecond: the D3 router's capacity controller needs the queue length `q`;
//! the metrics export each managed interface's root qdisc statistics (backlog, drops,
//! overlimits, fq's throttled flows); the health check looks for paceline's clsact filter.

use anyhow::{Context as _, Result, bail};
use netlink_packet_core::{NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload};
use netlink_packet_route::{
    RouteNetlinkMessage,
    tc::{TcAttribute, TcHandle, TcMessage, TcStats2, TcXstats},
};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};

const TC_H_ROOT: u32 = 0xffff_ffff;
/// clsact's egress hook (`TC_H_MAKE(TC_H_CLSACT, TC_H_MIN_EGRESS)`).
const CLSACT_EGRESS: u32 = 0xffff_fff3;

pub struct QdiscStats {
    sock: Socket,
    buf: Vec<u8>,
    seq: u32,
}

/// A root qdisc's statistics, summed over its children where that is how `tc -s` reads them
/// (mq adds up its per-queue fq qdiscs itself; fq's throttled count is summed here).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RootStats {
    /// The root qdisc's kind (`fq`, `mq`, `htb`, `noqueue`, ...).
    pub kind: String,
    pub backlog_bytes: u64,
    pub qlen: u64,
    pub drops: u64,
    pub overlimits: u64,
    pub requeues: u64,
    /// fq: packets held back by pacing (the sum of every fq's `throttled`); `None` without fq.
    pub throttled: Option<u64>,
}

/// Offset of `throttled` in the kernel's `struct tc_fq_qd_stats` (after gc_flows,
/// highprio_packets, tcp_retrans, all u64).
const FQ_THROTTLED_OFFSET: usize = 24;

impl QdiscStats {
    pub fn new() -> Result<QdiscStats> {
        let mut sock = Socket::new(NETLINK_ROUTE).context("opening a netlink socket")?;
        sock.bind_auto()?;
        sock.connect(&SocketAddr::new(0, 0))?;
        Ok(QdiscStats {
            sock,
            buf: vec![0; 64 * 1024],
            seq: 0,
        })
    }

    /// Dumps tc objects of `ifindex`: qdiscs, or the filters attached at `parent`.
    fn dump(&mut self, ifindex: u32, filters_at: Option<u32>) -> Result<Vec<TcMessage>> {
        let mut tc = TcMessage::default();
        tc.header.index = ifindex as i32;
        let msg = match filters_at {
            None => RouteNetlinkMessage::GetQueueDiscipline(tc),
            Some(parent) => {
                tc.header.parent = TcHandle::from(parent);
                RouteNetlinkMessage::GetTrafficFilter(tc)
            }
        };
        let mut req = NetlinkMessage::new(NetlinkHeader::default(), NetlinkPayload::from(msg));
        self.seq = self.seq.wrapping_add(1);
        req.header.flags = NLM_F_REQUEST | NLM_F_DUMP;
        req.header.sequence_number = self.seq;
        req.finalize();
        let mut out = vec![0u8; req.buffer_len()];
        req.serialize(&mut out);
        self.sock.send(&out, 0).context("RTM_GETQDISC/RTM_GETTFILTER")?;
        let mut found = Vec::new();
        loop {
            let n = self.sock.recv(&mut &mut self.buf[..], 0)?;
            let mut off = 0;
            while off < n {
                let msg = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&self.buf[off..n])
                    .context("parsing an rtnetlink tc message")?;
                let len = msg.header.length as usize;
                match msg.payload {
                    NetlinkPayload::Done(_) => return Ok(found),
                    NetlinkPayload::Error(e) => bail!("rtnetlink dump: {e:?}"),
                    NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewQueueDiscipline(m))
                    | NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewTrafficFilter(m))
                        if m.header.index == ifindex as i32 =>
                    {
                        found.push(m)
                    }
                    _ => {}
                }
                if len == 0 {
                    break;
                }
                off += len;
            }
        }
    }

    /// Bytes queued in the root qdisc of `ifindex` (what `tc -s qdisc show` calls backlog).
    pub fn root_backlog(&mut self, ifindex: u32) -> Result<u64> {
        self.root_stats(ifindex)?
            .map(|s| s.backlog_bytes)
            .ok_or_else(|| anyhow::anyhow!("no root qdisc on ifindex {ifindex}"))
    }

    /// The root qdisc's statistics of `ifindex` (`None`: no root qdisc reported).
    pub fn root_stats(&mut self, ifindex: u32) -> Result<Option<RootStats>> {
        let all = self.dump(ifindex, None)?;
        let mut root: Option<RootStats> = None;
        let mut throttled: Option<u64> = None;
        for m in &all {
            let kind = m
                .attributes
                .iter()
                .find_map(|a| match a {
                    TcAttribute::Kind(k) => Some(k.clone()),
                    _ => None,
                })
                .unwrap_or_default();
            if kind == "fq" {
                for a in &m.attributes {
                    let x = match a {
                        TcAttribute::Xstats(TcXstats::Other(x)) => Some(x),
                        TcAttribute::Stats2(list) => list.iter().find_map(|s| match s {
                            TcStats2::App(TcXstats::Other(x)) => Some(x),
                            _ => None,
                        }),
                        _ => None,
                    };
                    if let Some(x) = x
                        && let Some(b) = x.get(FQ_THROTTLED_OFFSET..FQ_THROTTLED_OFFSET + 8)
                    {
                        let v = u64::from_ne_bytes(b.try_into().expect("8 bytes"));
                        throttled = Some(throttled.unwrap_or(0) + v);
                        break;
                    }
                }
            }
            if u32::from(m.header.parent) != TC_H_ROOT {
                continue;
            }
            let mut s = RootStats {
                kind,
                ..Default::default()
            };
            for a in &m.attributes {
                match a {
                    TcAttribute::Stats2(list) => {
                        for st in list {
                            if let TcStats2::Queue(q) = st {
                                s.backlog_bytes = q.backlog as u64;
                                s.qlen = q.qlen as u64;
                                s.drops = q.drops as u64;
                                s.overlimits = q.overlimits as u64;
                                s.requeues = q.requeues as u64;
                            }
                        }
                    }
                    TcAttribute::Stats(st) if s.backlog_bytes == 0 && s.drops == 0 => {
                        s.backlog_bytes = st.backlog as u64;
                        s.qlen = st.qlen as u64;
                        s.drops = st.drops as u64;
                        s.overlimits = st.overlimits as u64;
                    }
                    _ => {}
                }
            }
            root = Some(s);
        }
        if let Some(r) = root.as_mut() {
            r.throttled = throttled;
        }
        Ok(root)
    }

    /// Is there a `bpf` filter at priority `prio` on the clsact egress hook of `ifindex`?
    pub fn has_egress_bpf_filter(&mut self, ifindex: u32, prio: u16) -> Result<bool> {
        let filters = self.dump(ifindex, Some(CLSACT_EGRESS))?;
        Ok(filters.iter().any(|m| {
            (m.header.info >> 16) as u16 == prio
                && m.attributes
                    .iter()
                    .any(|a| matches!(a, TcAttribute::Kind(k) if k == "bpf"))
        }))
    }
}
