//! The generators' wire format (all integers little-endian).
//!
//! | frame | layout | size |
//! | --- | --- | --- |
//! | TCP bulk header | `"PLBK"`, flow_id u32, total_bytes u64 (0 = until FIN) | 16 |
//! | TCP bulk ack | one byte `'K'`, sent by the server when `total_bytes` arrived | 1 |
//! | request (TCP and UDP) | `"PLRQ"`, req_len u32 (whole request incl. header and padding), id u64, ts_ns u64, resp_len u64, deadline_us u64 (0 = none), reserved u64 | 48 |
//! | response | `"PLRS"`, reserved u32, id u64, ts_ns u64 (both echoed), then zero padding up to `resp_len` | 24.. |
//! | UDP bulk data | `"PLBU"`, flow_id u32, seq u64, ts_ns u64 (send time), padding | 24.. |
//! | UDP bulk end | `"PLBF"`, flow_id u32, packets_sent u64, bytes_sent u64 | 24 |

use std::io::{self, Read};

/// TCP bulk upload magic.
pub const MAGIC_BULK: [u8; 4] = *b"PLBK";
/// Request magic.
pub const MAGIC_REQ: [u8; 4] = *b"PLRQ";
/// Response magic.
pub const MAGIC_RESP: [u8; 4] = *b"PLRS";
/// UDP bulk data magic.
pub const MAGIC_UDP_DATA: [u8; 4] = *b"PLBU";
/// UDP bulk end magic.
pub const MAGIC_UDP_FIN: [u8; 4] = *b"PLBF";

/// TCP bulk header size.
pub const BULK_HDR: usize = 16;
/// Request header size (the minimum request).
pub const REQ_HDR: usize = 48;
/// Response header size (the minimum response).
pub const RESP_HDR: usize = 24;
/// UDP bulk header size (the minimum datagram).
pub const UDP_HDR: usize = 24;
/// Largest UDP response the server sends (one datagram).
pub const MAX_UDP_RESP: u64 = 65_000;

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
}
fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
}

/// A request (see the table above).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// Total request length on the wire (>= [`REQ_HDR`]).
    pub req_len: u32,
    /// Request id (echoed).
    pub id: u64,
    /// Client timestamp (echoed), `CLOCK_MONOTONIC` ns.
    pub ts_ns: u64,
    /// Response length wanted (>= [`RESP_HDR`]; smaller values are raised).
    pub resp_len: u64,
    /// Deadline in microseconds from when the request was sent (0 = none).
    pub deadline_us: u64,
}

impl Request {
    /// Encodes the 48-byte header.
    pub fn encode(&self) -> [u8; REQ_HDR] {
        let mut b = [0u8; REQ_HDR];
        b[0..4].copy_from_slice(&MAGIC_REQ);
        b[4..8].copy_from_slice(&self.req_len.max(REQ_HDR as u32).to_le_bytes());
        b[8..16].copy_from_slice(&self.id.to_le_bytes());
        b[16..24].copy_from_slice(&self.ts_ns.to_le_bytes());
        b[24..32].copy_from_slice(&self.resp_len.to_le_bytes());
        b[32..40].copy_from_slice(&self.deadline_us.to_le_bytes());
        b
    }

    /// Decodes a header (magic checked).
    pub fn decode(b: &[u8]) -> io::Result<Request> {
        if b.len() < REQ_HDR || b[0..4] != MAGIC_REQ {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "not a PLRQ request"));
        }
        Ok(Request {
            req_len: u32_at(b, 4),
            id: u64_at(b, 8),
            ts_ns: u64_at(b, 16),
            resp_len: u64_at(b, 24).max(RESP_HDR as u64),
            deadline_us: u64_at(b, 32),
        })
    }
}

/// Writes a response header into the first [`RESP_HDR`] bytes of `buf`.
pub fn encode_resp_header(buf: &mut [u8], id: u64, ts_ns: u64) {
    buf[0..4].copy_from_slice(&MAGIC_RESP);
    buf[4..8].fill(0);
    buf[8..16].copy_from_slice(&id.to_le_bytes());
    buf[16..24].copy_from_slice(&ts_ns.to_le_bytes());
}

/// Decodes a response header: (id, ts_ns).
pub fn decode_resp_header(b: &[u8]) -> io::Result<(u64, u64)> {
    if b.len() < RESP_HDR || b[0..4] != MAGIC_RESP {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "not a PLRS response"));
    }
    Ok((u64_at(b, 8), u64_at(b, 16)))
}

/// Encodes a TCP bulk header.
pub fn encode_bulk_header(flow_id: u32, total_bytes: u64) -> [u8; BULK_HDR] {
    let mut b = [0u8; BULK_HDR];
    b[0..4].copy_from_slice(&MAGIC_BULK);
    b[4..8].copy_from_slice(&flow_id.to_le_bytes());
    b[8..16].copy_from_slice(&total_bytes.to_le_bytes());
    b
}

/// Decodes the 12 bytes after the `PLBK` magic: (flow_id, total_bytes).
pub fn decode_bulk_rest(b: &[u8]) -> (u32, u64) {
    (u32_at(b, 0), u64_at(b, 4))
}

/// Writes a UDP data header into `buf`.
pub fn encode_udp_data(buf: &mut [u8], flow_id: u32, seq: u64, ts_ns: u64) {
    buf[0..4].copy_from_slice(&MAGIC_UDP_DATA);
    buf[4..8].copy_from_slice(&flow_id.to_le_bytes());
    buf[8..16].copy_from_slice(&seq.to_le_bytes());
    buf[16..24].copy_from_slice(&ts_ns.to_le_bytes());
}

/// Encodes a UDP bulk end marker.
pub fn encode_udp_fin(flow_id: u32, packets: u64, bytes: u64) -> [u8; UDP_HDR] {
    let mut b = [0u8; UDP_HDR];
    b[0..4].copy_from_slice(&MAGIC_UDP_FIN);
    b[4..8].copy_from_slice(&flow_id.to_le_bytes());
    b[8..16].copy_from_slice(&packets.to_le_bytes());
    b[16..24].copy_from_slice(&bytes.to_le_bytes());
    b
}

/// A parsed UDP datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Datagram {
    /// Bulk data: flow, seq, send timestamp.
    Data { flow_id: u32, seq: u64, ts_ns: u64 },
    /// Bulk end: flow, packets sent, bytes sent.
    Fin { flow_id: u32, packets: u64, bytes: u64 },
    /// A request.
    Req(Request),
    /// Anything else.
    Unknown,
}

/// Classifies a UDP datagram.
pub fn parse_datagram(b: &[u8]) -> Datagram {
    if b.len() < UDP_HDR {
        return Datagram::Unknown;
    }
    match &b[0..4] {
        m if m == MAGIC_UDP_DATA => Datagram::Data {
            flow_id: u32_at(b, 4),
            seq: u64_at(b, 8),
            ts_ns: u64_at(b, 16),
        },
        m if m == MAGIC_UDP_FIN => Datagram::Fin {
            flow_id: u32_at(b, 4),
            packets: u64_at(b, 8),
            bytes: u64_at(b, 16),
        },
        m if m == MAGIC_REQ => Request::decode(b).map(Datagram::Req).unwrap_or(Datagram::Unknown),
        _ => Datagram::Unknown,
    }
}

/// Reads and discards exactly `n` bytes using `scratch`.
pub fn skip_exact<R: Read>(r: &mut R, mut n: u64, scratch: &mut [u8]) -> io::Result<()> {
    while n > 0 {
        let k = (n as usize).min(scratch.len());
        r.read_exact(&mut scratch[..k])?;
        n -= k as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_roundtrip() {
        let r = Request {
            req_len: 100,
            id: 7,
            ts_ns: 123,
            resp_len: 5000,
            deadline_us: 20_000,
        };
        assert_eq!(Request::decode(&r.encode()).unwrap(), r);
        let small = Request {
            req_len: 1,
            id: 1,
            ts_ns: 1,
            resp_len: 1,
            deadline_us: 0,
        };
        let d = Request::decode(&small.encode()).unwrap();
        assert_eq!((d.req_len, d.resp_len), (REQ_HDR as u32, RESP_HDR as u64));
        assert!(Request::decode(&[0u8; 48]).is_err());
    }

    #[test]
    fn datagrams() {
        let mut b = [0u8; 64];
        encode_udp_data(&mut b, 3, 9, 77);
        assert_eq!(
            parse_datagram(&b),
            Datagram::Data {
                flow_id: 3,
                seq: 9,
                ts_ns: 77
            }
        );
        assert_eq!(
            parse_datagram(&encode_udp_fin(3, 10, 640)),
            Datagram::Fin {
                flow_id: 3,
                packets: 10,
                bytes: 640
            }
        );
        let mut resp = [0u8; 24];
        encode_resp_header(&mut resp, 5, 6);
        assert_eq!(decode_resp_header(&resp).unwrap(), (5, 6));
        let h = encode_bulk_header(2, 1 << 40);
        assert_eq!(&h[0..4], b"PLBK");
        assert_eq!(decode_bulk_rest(&h[4..]), (2, 1 << 40));
    }
}
