//! Queue statistics of a root qdisc over rtnetlink (RTM_GETQDISC), cheap enough to read
//! every millisecond: the D3 router's capacity controller needs the queue length `q`.

use anyhow::{Context as _, Result, bail};
use netlink_packet_core::{NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload};
use netlink_packet_route::{
    RouteNetlinkMessage,
    tc::{TcAttribute, TcMessage, TcStats2},
};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};

const TC_H_ROOT: u32 = 0xffff_ffff;

pub struct QdiscStats {
    sock: Socket,
    buf: Vec<u8>,
    seq: u32,
}

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

    /// Bytes queued in the root qdisc of `ifindex` (what `tc -s qdisc show` calls backlog).
    pub fn root_backlog(&mut self, ifindex: u32) -> Result<u64> {
        let mut tc = TcMessage::default();
        tc.header.index = ifindex as i32;
        let mut req = NetlinkMessage::new(
            NetlinkHeader::default(),
            NetlinkPayload::from(RouteNetlinkMessage::GetQueueDiscipline(tc)),
        );
        self.seq = self.seq.wrapping_add(1);
        req.header.flags = NLM_F_REQUEST | NLM_F_DUMP;
        req.header.sequence_number = self.seq;
        req.finalize();
        let mut out = vec![0u8; req.buffer_len()];
        req.serialize(&mut out);
        self.sock.send(&out, 0).context("RTM_GETQDISC")?;
        let mut backlog = None;
        loop {
            let n = self.sock.recv(&mut &mut self.buf[..], 0)?;
            let mut off = 0;
            while off < n {
                let msg = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&self.buf[off..n])
                    .context("parsing an RTM_NEWQDISC message")?;
                let len = msg.header.length as usize;
                match msg.payload {
                    NetlinkPayload::Done(_) => {
                        return backlog.ok_or_else(|| anyhow::anyhow!("no root qdisc on ifindex {ifindex}"));
                    }
                    NetlinkPayload::Error(e) => bail!("RTM_GETQDISC: {e:?}"),
                    NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewQueueDiscipline(m))
                        if m.header.index == ifindex as i32 && u32::from(m.header.parent) == TC_H_ROOT =>
                    {
                        for a in &m.attributes {
                            match a {
                                TcAttribute::Stats2(list) => {
                                    for s in list {
                                        if let TcStats2::Queue(q) = s {
                                            backlog = Some(q.backlog as u64);
                                        }
                                    }
                                }
                                TcAttribute::Stats(s) if backlog.is_none() => {
                                    backlog = Some(s.backlog as u64)
                                }
                                _ => {}
                            }
                        }
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
}
