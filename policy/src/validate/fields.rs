//! Scalar fields: each parser takes a value as written ([`Scalar`]) and returns it parsed, or a
//! message that quotes it and says what would be valid. Shared by every section.

use ipnet::{IpNet, Ipv4Net};
use std::net::IpAddr;

use super::diag::Diag;
use crate::protocols;
use crate::raw::Scalar;
use crate::units::{self, UnitError};

/// Inclusive bounds of a quantity and how they are written in messages.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    pub min: u64,
    pub max: u64,
    pub text: &'static str,
}

/// Every rate (levels, classes, link rates): 1 kbit/s ..= 10 Tbit/s, in bytes/s.
pub const RATE: Bounds = Bounds {
    min: 125,
    max: 1_250_000_000_000,
    text: "1kbit..=10Tbit",
};

/// `100 has no unit; write e.g. "100Mbit" ...`: `example` spells the number as `N`.
fn no_unit(s: &Scalar, example: &str) -> String {
    let n = match s {
        Scalar::Str(t) => t.trim().to_string(),
        other => other.to_string(),
    };
    format!("{s} has no unit; write e.g. {}", example.replace('N', &n))
}

/// Parses a rate written in a policy: bytes/s, within `b` (`units::fmt_rate` writes one).
pub fn rate_in(s: &Scalar, b: Bounds) -> Result<u64, String> {
    let examples = units::RATE_EXAMPLES;
    let v = match s {
        Scalar::Str(t) => units::parse_rate(t),
        Scalar::Int(_) | Scalar::Float(_) => Err(UnitError::NoUnit),
        Scalar::Bool(_) => Err(UnitError::Invalid(String::new())),
    };
    match v {
        Ok(v) if v < b.min || v > b.max => Err(format!("{s} is out of range; valid: {}", b.text)),
        Ok(v) => Ok(v),
        Err(UnitError::NoUnit) => Err(no_unit(s, r#""NMbit" (bits/s) or "NMB/s" (bytes/s)"#)),
        Err(UnitError::Overflow) => Err(format!("{s} is too large; valid: {}", b.text)),
        Err(UnitError::Invalid(h)) if !h.is_empty() => {
            Err(format!("{s} is not a rate; write e.g. {examples} ({h})"))
        }
        Err(_) => Err(format!(
            "{s} is not a rate; write e.g. {examples} (units: {})",
            units::rate_unit_names()
        )),
    }
}

/// Parses a size written in a policy: bytes, within `b`.
pub fn size_in(s: &Scalar, b: Bounds) -> Result<u64, String> {
    let examples = units::SIZE_EXAMPLES;
    let v = match s {
        Scalar::Str(t) => units::parse_size(t),
        Scalar::Int(_) | Scalar::Float(_) => Err(UnitError::NoUnit),
        Scalar::Bool(_) => Err(UnitError::Invalid(String::new())),
    };
    match v {
        Ok(v) if v < b.min || v > b.max => Err(format!("{s} is out of range; valid: {}", b.text)),
        Ok(v) => Ok(v),
        Err(UnitError::NoUnit) => Err(no_unit(s, r#""NB""#)),
        Err(UnitError::Overflow) => Err(format!("{s} is too large; valid: {}", b.text)),
        Err(UnitError::Fraction) => Err(format!("{s} is not a whole number of bytes")),
        Err(UnitError::Invalid(h)) if !h.is_empty() => {
            Err(format!("{s} is not a size; write e.g. {examples} ({h})"))
        }
        Err(_) => Err(format!(
            "{s} is not a size; write e.g. {examples} (units: B, KB, KiB, MB, MiB, GB, GiB)"
        )),
    }
}

/// Parses a duration written in a policy: nanoseconds, within `b`.
pub fn duration_in(s: &Scalar, b: Bounds) -> Result<u64, String> {
    let examples = units::DURATION_EXAMPLES;
    let v = match s {
        Scalar::Str(t) => units::parse_duration(t),
        Scalar::Int(_) | Scalar::Float(_) => Err(UnitError::NoUnit),
        Scalar::Bool(_) => Err(UnitError::Invalid(String::new())),
    };
    match v {
        Ok(v) if v < b.min || v > b.max => Err(format!("{s} is out of range; valid: {}", b.text)),
        Ok(v) => Ok(v),
        Err(UnitError::NoUnit) => Err(no_unit(s, r#""Nms" or "Nus""#)),
        Err(UnitError::Overflow) => Err(format!("{s} is too large; valid: {}", b.text)),
        Err(UnitError::Fraction) => Err(format!("{s} is not a whole number of nanoseconds")),
        Err(UnitError::Invalid(_)) => Err(format!(
            "{s} is not a duration; write e.g. {examples} (units: ns, us, ms, s)"
        )),
    }
}

pub(super) fn int_range(v: i64, lo: i64, hi: i64) -> Result<i64, String> {
    if v < lo || v > hi {
        Err(format!("{v} is out of range; valid: {lo}..={hi}"))
    } else {
        Ok(v)
    }
}

/// Names become metric labels and HTB class names.
pub(super) fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a valid name; use 1 to 64 letters, digits, \"-\", \"_\" or \".\""
        ))
    }
}

pub(super) fn factor(s: &Scalar) -> Result<Option<f64>, String> {
    let bad = || format!("{s} is not a factor; write a number > 0 (e.g. 1, 1.44, 7.2) or \"unlimited\"");
    match s {
        Scalar::Str(t) if t.trim() == "unlimited" => Ok(None),
        Scalar::Int(i) => {
            if *i > 0 {
                Ok(Some(*i as f64))
            } else {
                Err(format!(
                    "{s} is out of range; valid: a number > 0 or \"unlimited\""
                ))
            }
        }
        Scalar::Float(f) => {
            if f.is_finite() && *f > 0.0 {
                Ok(Some(*f))
            } else {
                Err(format!(
                    "{s} is out of range; valid: a number > 0 or \"unlimited\""
                ))
            }
        }
        _ => Err(bad()),
    }
}

pub fn protocol(s: &Scalar) -> Result<u8, String> {
    let bad = || {
        format!(
            "{s} is not a protocol; write {} or a number 0..=255",
            protocols::names()
        )
    };
    match s {
        Scalar::Int(i) if (0..=255).contains(i) => Ok(*i as u8),
        Scalar::Int(i) => Err(format!("{i} is out of range; valid: 0..=255 or a name")),
        Scalar::Str(t) => protocols::by_name(t).ok_or_else(bad),
        _ => Err(bad()),
    }
}

pub(super) fn protocol_name(p: u8) -> String {
    protocols::name(p)
        .map(String::from)
        .unwrap_or_else(|| format!("protocol {p}"))
}

pub fn port(s: &Scalar) -> Result<(u16, u16), String> {
    let one = |t: &str| -> Option<u32> {
        let t = t.trim();
        if t.is_empty() || t.len() > 5 || !t.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        t.parse().ok()
    };
    let bad = || format!("{s} is not a port; write e.g. 443 or \"8000-8100\"");
    let (lo, hi) = match s {
        Scalar::Int(i) => {
            if (0..=65535).contains(i) {
                return Ok((*i as u16, *i as u16));
            }
            return Err(format!("{s} is out of range; valid: 0..=65535"));
        }
        Scalar::Str(t) => match t.split_once('-') {
            Some((a, b)) => (one(a).ok_or_else(bad)?, one(b).ok_or_else(bad)?),
            None => {
                let p = one(t).ok_or_else(bad)?;
                (p, p)
            }
        },
        _ => return Err(bad()),
    };
    if lo > 65535 || hi > 65535 {
        return Err(format!("{s} is out of range; valid: 0..=65535"));
    }
    if lo > hi {
        return Err(format!("{s} is reversed; write \"{hi}-{lo}\""));
    }
    Ok((lo as u16, hi as u16))
}

pub fn mark(s: &Scalar) -> Result<(u32, u32), String> {
    let bad = || format!("{s} is not a mark; write e.g. 16, \"0x10\" or \"0x10/0xff\"");
    let num = |t: &str| -> Result<u64, String> {
        let t = t.trim();
        let r = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
            Some(h) => u64::from_str_radix(h, 16),
            None => t.parse::<u64>(),
        };
        match r {
            Ok(v) if v <= u64::from(u32::MAX) => Ok(v),
            Ok(_) => Err(format!("{s} is out of range; marks are 32 bits (0..=0xffffffff)")),
            Err(_) => Err(bad()),
        }
    };
    let (v, m) = match s {
        Scalar::Int(i) => {
            if (0..=i128::from(u32::MAX)).contains(i) {
                (*i as u64, u64::from(u32::MAX))
            } else {
                return Err(format!("{s} is out of range; marks are 32 bits (0..=0xffffffff)"));
            }
        }
        Scalar::Str(t) => match t.split_once('/') {
            Some((a, b)) => (num(a)?, num(b)?),
            None => (num(t)?, u64::from(u32::MAX)),
        },
        _ => return Err(bad()),
    };
    let (v, m) = (v as u32, m as u32);
    if m == 0 {
        return Err(format!(
            "{s}: a mask of 0 matches every packet; remove the field to match any mark"
        ));
    }
    if v & !m != 0 {
        return Err(format!(
            "{s}: the value {v:#x} has bits outside the mask {m:#x}, so it can never match"
        ));
    }
    Ok((v, m))
}

/// An address or CIDR; returns the network and, when host bits were set, a warning.
pub fn net(s: &Scalar) -> Result<(IpNet, Option<String>), String> {
    let bad = || {
        format!(
            "{s} is not an address; write a CIDR (\"10.0.0.0/8\", \"fd00::/8\") or an address (\"10.1.2.3\")"
        )
    };
    let Scalar::Str(t) = s else { return Err(bad()) };
    let t = t.trim();
    let n = if let Ok(n) = t.parse::<IpNet>() {
        n
    } else if let Ok(a) = t.parse::<IpAddr>() {
        IpNet::from(a)
    } else {
        return Err(bad());
    };
    // IPv4-mapped IPv6 (::ffff:a.b.c.d/p, p >= 96) is IPv4: that is how the datapath sees v4.
    let n = match n {
        IpNet::V6(v6) if v6.prefix_len() >= 96 && v6.addr().to_ipv4_mapped().is_some() => {
            let a = v6.addr().to_ipv4_mapped().expect("checked");
            IpNet::V4(Ipv4Net::new(a, v6.prefix_len() - 96).expect("prefix <= 32"))
        }
        n => n,
    };
    let t2 = n.trunc();
    let warn = (t2 != n).then(|| format!("{s} has host bits set; it matches {t2}"));
    Ok((t2, warn))
}

/// Index of `name` in `names`, or an error listing the valid names.
pub(super) fn lookup(
    d: &mut Diag,
    path: &str,
    name: &str,
    names: &[&str],
    what: &str,
    plural: &str,
) -> Option<usize> {
    let found = names.iter().position(|n| *n == name);
    if found.is_none() {
        d.error(
            path,
            format!("no {what} named {name:?}; {plural}: {}", names.join(", ")),
        );
    }
    found
}

/// `Option<Option<T>>` from `opt.map(check)`: `Some(None)` means the check failed.
pub(super) trait TransposeOk<T> {
    fn transpose_ok(self) -> Option<Option<T>>;
}
impl<T> TransposeOk<T> for Option<Option<T>> {
    fn transpose_ok(self) -> Option<Option<T>> {
        match self {
            None => Some(None),
            Some(Some(v)) => Some(Some(v)),
            Some(None) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(t: &str) -> Scalar {
        Scalar::Str(t.into())
    }

    #[test]
    fn rate_messages() {
        assert_eq!(rate_in(&s("10Gbit"), RATE), Ok(1_250_000_000));
        assert_eq!(
            rate_in(&s("10 Gbits"), RATE).unwrap_err(),
            r#""10 Gbits" is not a rate; write e.g. "10Gbit", "250Mbit", "1.5Gbit" (write the unit without the plural s: "Gbit")"#
        );
        assert_eq!(
            rate_in(&Scalar::Int(100), RATE).unwrap_err(),
            r#"100 has no unit; write e.g. "100Mbit" (bits/s) or "100MB/s" (bytes/s)"#
        );
        assert_eq!(
            rate_in(&s("20Tbit"), RATE).unwrap_err(),
            r#""20Tbit" is out of range; valid: 1kbit..=10Tbit"#
        );
        assert_eq!(
            rate_in(&s("100bit"), RATE).unwrap_err(),
            r#""100bit" is out of range; valid: 1kbit..=10Tbit"#
        );
        assert!(
            rate_in(&s("99999999999999999999999Tbit"), RATE)
                .unwrap_err()
                .contains("is too large")
        );
        assert!(
            rate_in(&s("fast"), RATE)
                .unwrap_err()
                .contains("units: bit, kbit")
        );
    }

    #[test]
    fn ports() {
        assert_eq!(port(&Scalar::Int(443)), Ok((443, 443)));
        assert_eq!(port(&s("11211")), Ok((11211, 11211)));
        assert_eq!(port(&s("8000-8100")), Ok((8000, 8100)));
        assert_eq!(port(&s(" 0 - 65535 ")), Ok((0, 65535)));
        assert_eq!(
            port(&s("9000-8000")).unwrap_err(),
            r#""9000-8000" is reversed; write "8000-9000""#
        );
        assert_eq!(
            port(&Scalar::Int(70000)).unwrap_err(),
            "70000 is out of range; valid: 0..=65535"
        );
        assert_eq!(
            port(&s("1-70000")).unwrap_err(),
            r#""1-70000" is out of range; valid: 0..=65535"#
        );
        assert!(port(&s("http")).unwrap_err().contains("is not a port"));
        assert!(port(&s("1-2-3")).is_err());
    }

    #[test]
    fn marks() {
        assert_eq!(mark(&Scalar::Int(16)), Ok((16, u32::MAX)));
        assert_eq!(mark(&s("0x10/0xff")), Ok((0x10, 0xff)));
        assert_eq!(mark(&s("16/255")), Ok((16, 255)));
        assert_eq!(mark(&s("0xFFFFFFFF")), Ok((u32::MAX, u32::MAX)));
        assert!(mark(&s("0x100000000")).unwrap_err().contains("32 bits"));
        assert!(
            mark(&s("0x110/0xff"))
                .unwrap_err()
                .contains("bits outside the mask")
        );
        assert!(mark(&s("1/0")).unwrap_err().contains("mask of 0"));
        assert!(mark(&Scalar::Int(-1)).is_err());
        assert!(mark(&s("x10")).is_err());
    }

    #[test]
    fn protocols() {
        assert_eq!(protocol(&s("tcp")), Ok(6));
        assert_eq!(protocol(&s("UDP")), Ok(17));
        assert_eq!(protocol(&s("icmpv6")), Ok(58));
        assert_eq!(protocol(&Scalar::Int(47)), Ok(47));
        assert!(protocol(&Scalar::Int(256)).is_err());
        assert!(protocol(&s("gre")).unwrap_err().contains("write tcp, udp"));
    }

    #[test]
    fn nets() {
        assert_eq!(
            net(&s("10.0.0.0/8")).unwrap(),
            ("10.0.0.0/8".parse().unwrap(), None)
        );
        assert_eq!(
            net(&s("10.1.2.3")).unwrap().0,
            "10.1.2.3/32".parse::<IpNet>().unwrap()
        );
        assert_eq!(
            net(&s("fd00::1")).unwrap().0,
            "fd00::1/128".parse::<IpNet>().unwrap()
        );
        let (n, w) = net(&s("10.1.2.3/16")).unwrap();
        assert_eq!(n, "10.1.0.0/16".parse::<IpNet>().unwrap());
        assert_eq!(
            w.unwrap(),
            r#""10.1.2.3/16" has host bits set; it matches 10.1.0.0/16"#
        );
        assert_eq!(
            net(&s("::ffff:10.0.0.0/104")).unwrap().0,
            "10.0.0.0/8".parse::<IpNet>().unwrap()
        );
        assert!(net(&s("10.0.0.0/33")).is_err());
        assert!(net(&Scalar::Int(10)).is_err());
    }

    #[test]
    fn factors() {
        assert_eq!(factor(&Scalar::Int(1)), Ok(Some(1.0)));
        assert_eq!(factor(&Scalar::Float(1.44)), Ok(Some(1.44)));
        assert_eq!(factor(&s("unlimited")), Ok(None));
        assert!(factor(&Scalar::Int(0)).unwrap_err().contains("out of range"));
        assert!(factor(&Scalar::Float(-2.0)).is_err());
        assert!(factor(&s("1.44")).unwrap_err().contains("is not a factor"));
    }

    #[test]
    fn names() {
        assert!(check_name("memcached-1.a_b").is_ok());
        assert!(check_name("").is_err());
        assert!(check_name("has space").unwrap_err().contains("letters, digits"));
        assert!(check_name(&"x".repeat(65)).is_err());
    }
}
