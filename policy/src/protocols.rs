//! The IP protocols a policy may name: one table read by the parser ([`by_name`]), the
//! messages ([`names`], [`with_ports`]), the rule text of reports ([`name`]) and the JSON
//! schema ([`NAMES`]).

/// A protocol known by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Protocol {
    pub name: &'static str,
    pub number: u8,
    /// The first four transport bytes are ports (what the datapath matches ports on).
    pub ports: bool,
}

/// In the order messages and the schema list them.
pub const PROTOCOLS: [Protocol; 6] = [
    Protocol {
        name: "tcp",
        number: 6,
        ports: true,
    },
    Protocol {
        name: "udp",
        number: 17,
        ports: true,
    },
    Protocol {
        name: "icmp",
        number: 1,
        ports: false,
    },
    Protocol {
        name: "icmpv6",
        number: 58,
        ports: false,
    },
    Protocol {
        name: "sctp",
        number: 132,
        ports: true,
    },
    Protocol {
        name: "udplite",
        number: 136,
        ports: true,
    },
];

/// Other spellings accepted for a protocol of [`PROTOCOLS`] (`/etc/protocols`' name of 58).
const ALIASES: [(&str, u8); 1] = [("ipv6-icmp", 58)];

/// The names of [`PROTOCOLS`], in order (the schema's `enum`).
pub const NAMES: [&str; PROTOCOLS.len()] = {
    let mut out = [""; PROTOCOLS.len()];
    let mut i = 0;
    while i < PROTOCOLS.len() {
        out[i] = PROTOCOLS[i].name;
        i += 1;
    }
    out
};

/// The number of a protocol name (case-insensitive, surrounding spaces ignored).
pub fn by_name(name: &str) -> Option<u8> {
    let name = name.trim().to_ascii_lowercase();
    PROTOCOLS
        .iter()
        .map(|p| (p.name, p.number))
        .chain(ALIASES)
        .find(|(n, _)| *n == name)
        .map(|(_, number)| number)
}

/// The name of protocol `number`, if it has one.
pub fn name(number: u8) -> Option<&'static str> {
    PROTOCOLS.iter().find(|p| p.number == number).map(|p| p.name)
}

/// Whether protocol `number` carries ports the datapath matches.
pub fn has_ports(number: u8) -> bool {
    PROTOCOLS.iter().any(|p| p.number == number && p.ports)
}

/// `tcp, udp, icmp, icmpv6, sctp, udplite`.
pub fn names() -> String {
    NAMES.join(", ")
}

/// `tcp, udp, sctp and udplite`: the protocols with ports.
pub fn with_ports() -> String {
    let v: Vec<&str> = PROTOCOLS.iter().filter(|p| p.ports).map(|p| p.name).collect();
    match v.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
        _ => v.concat(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_numbers() {
        assert_eq!(by_name("tcp"), Some(6));
        assert_eq!(by_name(" UDP "), Some(17));
        assert_eq!(by_name("ipv6-icmp"), Some(58));
        assert_eq!(by_name("gre"), None);
        assert_eq!(name(136), Some("udplite"));
        assert_eq!(name(47), None);
        assert!(has_ports(132) && !has_ports(1) && !has_ports(47));
        assert_eq!(names(), "tcp, udp, icmp, icmpv6, sctp, udplite");
        assert_eq!(with_ports(), "tcp, udp, sctp and udplite");
    }
}
