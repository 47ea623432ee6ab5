//! Units written out in policy files: rates, sizes and durations.
//!
//! Every quantity in a policy carries its unit; a bare number is refused because `100` could
//! mean bits or bytes, milliseconds or seconds. Numbers are decimal and may have a fraction
//! (`1.5Gbit`); they are converted with exact integer arithmetic, so `1.5Gbit` is exactly
//! 187 500 000 bytes/s. A space between number and unit is allowed (`10 Gbit`).
//!
//! # Rates (converted to bytes/s)
//! - bits per second, decimal prefixes: `bit`, `kbit`, `Mbit`, `Gbit`, `Tbit`. The prefix letter
//!   is case-insensitive (`mbit` = `Mbit` = 10^6 bit/s, as in `tc`: a milli-bit rate makes no
//!   sense). A `/s` suffix is allowed: `Mbit/s`.
//! - the `bps` spellings, also bits per second: `bps`, `Kbps`, `Mbps`, `Gbps`, `Tbps`. Their
//!   all-lower-case forms `kbps`, `mbps`, `gbps`, `tbps` are **refused**: `tc` reads them as
//!   *bytes* per second while most people read them as bits, an 8x ambiguity.
//! - bytes per second: `B/s`, `KB/s` (= `kB/s`), `MB/s`, `GB/s`, `TB/s` (decimal) and `KiB/s`,
//!   `MiB/s`, `GiB/s`, `TiB/s` (binary).
//! - `Gb/s`-style spellings are refused with a hint: one letter's case would make an 8x
//!   difference.
//!
//! # Sizes (bytes)
//! `B`, `KB` (= `kB`) = 1000, `KiB` = 1024, `MB`, `MiB`, `GB`, `GiB`.
//!
//! # Durations (nanoseconds)
//! `ns`, `us` (= `µs`), `ms`, `s`, with fractions (`1.5ms`); anything else that
//! `humantime` understands (`1s 500ms`, `2min`) is accepted too. Zero still needs a unit (`0s`).

use std::fmt;

/// Why a quantity could not be parsed; the caller turns it into a message about the field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UnitError {
    /// Not `<number><unit>` with a known unit; the text is a hint or empty.
    Invalid(String),
    /// A number without a unit.
    NoUnit,
    /// The value does not fit in 64 bits.
    Overflow,
    /// The value is not a whole number of the base unit (e.g. `1.5B`).
    Fraction,
}

/// A non-negative decimal number: `mantissa / 10^scale`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Decimal {
    mantissa: u128,
    scale: u32,
}

/// Splits `"1.5 Gbit"` into the number and the unit text; `None` when it does not start with a
/// plain decimal number.
fn split(text: &str) -> Option<(Decimal, &str)> {
    let t = text.trim();
    let end = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(end);
    let (int, frac) = match num.split_once('.') {
        Some((i, f)) => (i, f),
        None => (num, ""),
    };
    // One decimal point at most: `1.2.3` is no number (its second `.` was once read as a
    // digit, found by the policy fuzzer: a panic in debug builds, a wrong value in release).
    if int.is_empty() || (num.contains('.') && frac.is_empty()) || frac.contains('.') {
        return None;
    }
    if int.len() + frac.len() > 36 {
        // More digits than u128 holds safely: report as overflow through a huge mantissa.
        return Some((
            Decimal {
                mantissa: u128::MAX,
                scale: 0,
            },
            unit.trim_start(),
        ));
    }
    let mut mantissa: u128 = 0;
    for c in int.chars().chain(frac.chars()) {
        mantissa = mantissa * 10 + u128::from(c as u8 - b'0');
    }
    Some((
        Decimal {
            mantissa,
            scale: frac.len() as u32,
        },
        unit.trim_start(),
    ))
}

/// `d * num / den`, exact; `Err(Fraction)` when not whole (unless `floor`), `Err(Overflow)`
/// beyond u64.
fn scale(d: Decimal, num: u128, den: u128, floor: bool) -> Result<u64, UnitError> {
    if d.mantissa == u128::MAX {
        return Err(UnitError::Overflow);
    }
    let p = d.mantissa.checked_mul(num).ok_or(UnitError::Overflow)?;
    let den = den.checked_mul(10u128.pow(d.scale)).ok_or(UnitError::Overflow)?;
    if !floor && p % den != 0 {
        return Err(UnitError::Fraction);
    }
    u64::try_from(p / den).map_err(|_| UnitError::Overflow)
}

/// A rate unit: its spelling and its value as `num/den` bytes per second.
struct Unit {
    name: &'static str,
    num: u128,
    den: u128,
}

const fn bits(name: &'static str, mult: u128) -> Unit {
    Unit {
        name,
        num: mult,
        den: 8,
    }
}
const fn bytes(name: &'static str, mult: u128) -> Unit {
    Unit {
        name,
        num: mult,
        den: 1,
    }
}

const K: u128 = 1_000;
const M: u128 = 1_000_000;
const G: u128 = 1_000_000_000;
const T: u128 = 1_000_000_000_000;
const KI: u128 = 1 << 10;
const MI: u128 = 1 << 20;
const GI: u128 = 1 << 30;
const TI: u128 = 1 << 40;

const RATE_UNITS: &[Unit] = &[
    bits("bit", 1),
    bits("kbit", K),
    bits("Kbit", K),
    bits("mbit", M),
    bits("Mbit", M),
    bits("gbit", G),
    bits("Gbit", G),
    bits("tbit", T),
    bits("Tbit", T),
    bits("bit/s", 1),
    bits("kbit/s", K),
    bits("Kbit/s", K),
    bits("mbit/s", M),
    bits("Mbit/s", M),
    bits("gbit/s", G),
    bits("Gbit/s", G),
    bits("tbit/s", T),
    bits("Tbit/s", T),
    bits("bps", 1),
    bits("Kbps", K),
    bits("Mbps", M),
    bits("Gbps", G),
    bits("Tbps", T),
    bytes("B/s", 1),
    bytes("kB/s", K),
    bytes("KB/s", K),
    bytes("MB/s", M),
    bytes("GB/s", G),
    bytes("TB/s", T),
    bytes("KiB/s", KI),
    bytes("MiB/s", MI),
    bytes("GiB/s", GI),
    bytes("TiB/s", TI),
];

const SIZE_UNITS: &[Unit] = &[
    bytes("B", 1),
    bytes("kB", K),
    bytes("KB", K),
    bytes("KiB", KI),
    bytes("MB", M),
    bytes("MiB", MI),
    bytes("GB", G),
    bytes("GiB", GI),
];

/// Duration units in nanoseconds.
const DURATION_UNITS: &[Unit] = &[
    bytes("ns", 1),
    bytes("us", 1_000),
    bytes("µs", 1_000),
    bytes("μs", 1_000),
    bytes("ms", 1_000_000),
    bytes("s", 1_000_000_000),
];

/// The example list printed when a rate cannot be parsed.
pub const RATE_EXAMPLES: &str = r#""10Gbit", "250Mbit", "1.5Gbit""#;
pub const SIZE_EXAMPLES: &str = r#""9KB", "1500B", "64KiB""#;
pub const DURATION_EXAMPLES: &str = r#""100ms", "4us", "1.5s""#;

fn regex_alternatives(units: &[Unit]) -> String {
    // '/' and 'µ' are not special in ECMA 262 or Rust regexes: no escaping needed.
    units.iter().map(|u| u.name).collect::<Vec<_>>().join("|")
}

/// JSON-schema (ECMA 262) pattern of a rate; generated from the same table the parser uses.
pub fn rate_pattern() -> String {
    format!(
        r"^\s*[0-9]+(\.[0-9]+)?\s*({})\s*$",
        regex_alternatives(RATE_UNITS)
    )
}
pub fn size_pattern() -> String {
    format!(
        r"^\s*[0-9]+(\.[0-9]+)?\s*({})\s*$",
        regex_alternatives(SIZE_UNITS)
    )
}
/// Durations: the simple form only (the humantime fallback is not expressible as a pattern; it
/// is accepted by the agent but an editor using the schema will flag it).
pub fn duration_pattern() -> String {
    format!(
        r"^\s*[0-9]+(\.[0-9]+)?\s*({})\s*$",
        regex_alternatives(DURATION_UNITS)
    )
}

/// The unit names accepted for rates, for error messages.
pub fn rate_unit_names() -> String {
    "bit, kbit, Mbit, Gbit, Tbit (also with /s), bps, Kbps, Mbps, Gbps, Tbps; bytes: B/s, KB/s, \
     MB/s, GB/s, TB/s, KiB/s, MiB/s, GiB/s, TiB/s"
        .to_string()
}

/// Parses a rate into bytes per second (rounded down to whole bytes).
pub fn parse_rate(text: &str) -> Result<u64, UnitError> {
    let Some((d, unit)) = split(text) else {
        return Err(UnitError::Invalid(String::new()));
    };
    if unit.is_empty() {
        return Err(UnitError::NoUnit);
    }
    if let Some(u) = RATE_UNITS.iter().find(|u| u.name == unit) {
        return scale(d, u.num, u.den, true);
    }
    let hint = match unit {
        "kbps" | "mbps" | "gbps" | "tbps" => {
            let p = unit[..1].to_uppercase();
            format!(
                "\"{unit}\" is ambiguous: tc reads it as {p}bytes/s, most people as {p}bits/s; \
                 write \"{p}bit\" (bits) or \"{p}B/s\" (bytes)"
            )
        }
        "b/s" | "kb/s" | "Kb/s" | "mb/s" | "Mb/s" | "gb/s" | "Gb/s" | "tb/s" | "Tb/s" => {
            let p = unit[..unit.len() - 3].to_uppercase();
            format!("write \"{p}bit\" for bits or \"{p}B/s\" for bytes (\"b\" vs \"B\" is an 8x difference)")
        }
        u if u.ends_with("bits") || u.ends_with("bits/s") => {
            format!(
                "write the unit without the plural s: \"{}\"",
                u.replace("bits", "bit")
            )
        }
        _ => String::new(),
    };
    Err(UnitError::Invalid(hint))
}

/// Parses a size into bytes.
pub fn parse_size(text: &str) -> Result<u64, UnitError> {
    let Some((d, unit)) = split(text) else {
        return Err(UnitError::Invalid(String::new()));
    };
    if unit.is_empty() {
        return Err(UnitError::NoUnit);
    }
    match SIZE_UNITS.iter().find(|u| u.name == unit) {
        Some(u) => scale(d, u.num, u.den, false),
        None => Err(UnitError::Invalid(match unit {
            "b" => "\"b\" would be bits; sizes are in bytes: write \"B\"".to_string(),
            "kb" | "Kb" | "mb" | "Mb" | "gb" | "Gb" => format!(
                "write \"{}B\" (1000) or \"{}iB\" (1024); sizes are in bytes",
                unit[..1].to_uppercase(),
                unit[..1].to_uppercase()
            ),
            _ => String::new(),
        })),
    }
}

/// Parses a duration into nanoseconds.
pub fn parse_duration(text: &str) -> Result<u64, UnitError> {
    if let Some((d, unit)) = split(text) {
        if unit.is_empty() {
            return Err(UnitError::NoUnit);
        }
        if let Some(u) = DURATION_UNITS.iter().find(|u| u.name == unit) {
            return scale(d, u.num, u.den, false);
        }
    }
    match humantime::parse_duration(text.trim()) {
        Ok(d) => u64::try_from(d.as_nanos()).map_err(|_| UnitError::Overflow),
        Err(humantime::DurationError::NumberOverflow) => Err(UnitError::Overflow),
        Err(_) => Err(UnitError::Invalid(String::new())),
    }
}

// ---- Formatting (reports and error messages) ----

/// `x` with three significant digits and the largest unit from `units` (ascending, each with its
/// factor) that keeps the number at or above 1.
fn sig3(x: f64, units: &[(&str, f64)]) -> String {
    if x == 0.0 {
        return format!("0 {}", units[0].0);
    }
    let mut i = 0;
    while i + 1 < units.len() && x >= units[i + 1].1 {
        i += 1;
    }
    let mut v = x / units[i].1;
    // Rounding to 3 digits may carry into the next unit (999.7 -> 1000).
    let round3 = |v: f64| {
        let digits = if v >= 100.0 {
            0
        } else if v >= 10.0 {
            1
        } else {
            2
        };
        let p = 10f64.powi(digits);
        ((v * p).round() / p, digits as usize)
    };
    let (mut r, mut digits) = round3(v);
    if r >= 1000.0 && i + 1 < units.len() {
        i += 1;
        v = x / units[i].1;
        (r, digits) = round3(v);
    }
    format!("{r:.digits$} {}", units[i].0)
}

/// A rate in bytes/s shown in bits per second: `"5.00 Mbit/s"`, `"10.0 Gbit/s"`.
pub fn fmt_rate(bytes_per_sec: u64) -> String {
    sig3(
        bytes_per_sec as f64 * 8.0,
        &[
            ("bit/s", 1.0),
            ("kbit/s", 1e3),
            ("Mbit/s", 1e6),
            ("Gbit/s", 1e9),
            ("Tbit/s", 1e12),
        ],
    )
}

/// A duration in seconds: `"14.4 ms"`, `"4.00 µs"`.
pub fn fmt_secs(secs: f64) -> String {
    sig3(secs, &[("ns", 1e-9), ("µs", 1e-6), ("ms", 1e-3), ("s", 1.0)])
}

/// A duration in nanoseconds, exact when short: `"100ms"`, `"4us"`, `"1.5ms"` -> `"1.5 ms"`.
pub fn fmt_ns(ns: u64) -> String {
    for (unit, f) in [("s", 1_000_000_000u64), ("ms", 1_000_000), ("us", 1_000)] {
        if ns >= f && ns.is_multiple_of(f) {
            return format!("{}{unit}", ns / f);
        }
    }
    if ns >= 1_000 {
        return fmt_secs(ns as f64 * 1e-9).replace(' ', "");
    }
    format!("{ns}ns")
}

/// A size in bytes: `"9000 B"`, with the exact count.
pub fn fmt_size(b: u64) -> String {
    format!("{b} B")
}

/// How a parsed value is shown in range messages (`valid: 1kbit..=10Tbit`).
pub struct Range<'a>(pub &'a str, pub &'a str);
impl fmt::Display for Range<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}..={}", self.0, self.1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_in_bits() {
        assert_eq!(parse_rate("10Gbit"), Ok(1_250_000_000));
        assert_eq!(parse_rate("10 Gbit"), Ok(1_250_000_000));
        assert_eq!(parse_rate("250Mbit"), Ok(31_250_000));
        assert_eq!(parse_rate("250mbit"), Ok(31_250_000), "tc's spelling: mega");
        assert_eq!(parse_rate("1.5Gbit"), Ok(187_500_000));
        assert_eq!(parse_rate("100kbit"), Ok(12_500));
        assert_eq!(parse_rate("100Kbit"), Ok(12_500));
        assert_eq!(parse_rate("1Tbit"), Ok(125_000_000_000));
        assert_eq!(parse_rate("8bit"), Ok(1));
        assert_eq!(parse_rate("12bit"), Ok(1), "rounded down to whole bytes");
        assert_eq!(parse_rate("10Gbit/s"), Ok(1_250_000_000));
        assert_eq!(parse_rate("  5 Mbit/s  "), Ok(625_000));
    }

    #[test]
    fn bps_synonyms_are_bits() {
        assert_eq!(parse_rate("10Gbps"), Ok(1_250_000_000));
        assert_eq!(parse_rate("100Mbps"), Ok(12_500_000));
        assert_eq!(parse_rate("64Kbps"), Ok(8_000));
        assert_eq!(parse_rate("800bps"), Ok(100));
    }

    #[test]
    fn byte_rates() {
        assert_eq!(parse_rate("125MB/s"), Ok(125_000_000));
        assert_eq!(parse_rate("1KiB/s"), Ok(1024));
        assert_eq!(parse_rate("1.5GB/s"), Ok(1_500_000_000));
        assert_eq!(parse_rate("2MiB/s"), Ok(2 << 20));
    }

    #[test]
    fn ambiguous_and_bad_rates() {
        for bad in [
            "10 Gbits",
            "10",
            "Gbit",
            "10Gbit extra",
            "-5Mbit",
            "1e9bit",
            "10GBIT",
            "1.Gbit",
            ".5Gbit",
            "",
        ] {
            assert!(parse_rate(bad).is_err(), "{bad:?} should be refused");
        }
        assert_eq!(parse_rate("10"), Err(UnitError::NoUnit));
        match parse_rate("100mbps") {
            Err(UnitError::Invalid(h)) => {
                assert!(h.contains("ambiguous") && h.contains("\"Mbit\""), "{h}")
            }
            other => panic!("{other:?}"),
        }
        match parse_rate("10Gb/s") {
            Err(UnitError::Invalid(h)) => {
                assert!(h.contains("\"Gbit\"") && h.contains("\"GB/s\""), "{h}")
            }
            other => panic!("{other:?}"),
        }
        match parse_rate("10 Gbits") {
            Err(UnitError::Invalid(h)) => assert!(h.contains("\"Gbit\""), "{h}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn rate_overflow() {
        assert_eq!(
            parse_rate("99999999999999999999999Tbit"),
            Err(UnitError::Overflow)
        );
        assert_eq!(
            parse_rate("1000000000000000000000000000000000000000000bit"),
            Err(UnitError::Overflow)
        );
        // Just inside u64 bytes/s, then just outside.
        assert_eq!(parse_rate("18446744073709551615B/s"), Ok(u64::MAX));
        assert_eq!(parse_rate("18446744073709551616B/s"), Err(UnitError::Overflow));
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("9KB"), Ok(9_000));
        assert_eq!(parse_size("9kB"), Ok(9_000));
        assert_eq!(parse_size("64KiB"), Ok(65_536));
        assert_eq!(parse_size("1500B"), Ok(1_500));
        assert_eq!(parse_size("1.5KB"), Ok(1_500));
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert_eq!(parse_size("2GB"), Ok(2_000_000_000));
        assert_eq!(parse_size("1.5B"), Err(UnitError::Fraction));
        assert_eq!(parse_size("9000"), Err(UnitError::NoUnit));
        assert!(matches!(parse_size("9kb"), Err(UnitError::Invalid(h)) if h.contains("\"KB\"")));
        assert!(matches!(parse_size("9 Kbyte"), Err(UnitError::Invalid(_))));
        assert_eq!(parse_size("99999999999999999999GB"), Err(UnitError::Overflow));
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("100ms"), Ok(100_000_000));
        assert_eq!(parse_duration("4us"), Ok(4_000));
        assert_eq!(parse_duration("4µs"), Ok(4_000));
        assert_eq!(parse_duration("1.5ms"), Ok(1_500_000));
        assert_eq!(parse_duration("0s"), Ok(0));
        assert_eq!(parse_duration("10s"), Ok(10_000_000_000));
        assert_eq!(parse_duration("250ns"), Ok(250));
        assert_eq!(
            parse_duration("1s 500ms"),
            Ok(1_500_000_000),
            "humantime fallback"
        );
        assert_eq!(parse_duration("2min"), Ok(120_000_000_000), "humantime fallback");
        assert_eq!(parse_duration("0"), Err(UnitError::NoUnit));
        assert_eq!(parse_duration("100"), Err(UnitError::NoUnit));
        assert_eq!(parse_duration("1.5ns"), Err(UnitError::Fraction));
        assert!(parse_duration("fast").is_err());
        assert!(parse_duration("5 parsecs").is_err());
        assert_eq!(parse_duration("99999999999999999999s"), Err(UnitError::Overflow));
        // Found by the policy fuzzer (`horizon: 10.0.0.0/8000ms`): a second `.` was a digit.
        for bad in ["1.2.3ms", "10.0.0.0/8000ms", "1..5ms"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
        assert!(parse_rate("1.2.3Gbit").is_err());
        assert!(parse_size("1.2.3KB").is_err());
    }

    #[test]
    fn formatting() {
        assert_eq!(fmt_rate(625_000), "5.00 Mbit/s");
        assert_eq!(fmt_rate(900_000), "7.20 Mbit/s");
        assert_eq!(fmt_rate(1_250_000_000), "10.0 Gbit/s");
        assert_eq!(fmt_rate(15_625_000_000), "125 Gbit/s");
        assert_eq!(
            fmt_rate(124_990_000),
            "1.00 Gbit/s",
            "999.92 Mbit/s rounds into Gbit/s"
        );
        assert_eq!(fmt_rate(1), "8.00 bit/s");
        assert_eq!(fmt_rate(0), "0 bit/s");
        assert_eq!(fmt_secs(0.0144), "14.4 ms");
        assert_eq!(fmt_secs(0.000004), "4.00 µs");
        assert_eq!(fmt_secs(0.0072), "7.20 ms");
        assert_eq!(fmt_secs(1.44), "1.44 s");
        assert_eq!(fmt_ns(100_000_000), "100ms");
        assert_eq!(fmt_ns(4_000), "4us");
        assert_eq!(fmt_ns(1_500_000), "1500us");
        assert_eq!(fmt_ns(1_500), "1.50µs");
        assert_eq!(fmt_ns(0), "0ns");
    }

    #[test]
    fn patterns_name_every_unit() {
        let p = rate_pattern();
        for u in RATE_UNITS {
            assert!(p.contains(u.name), "{}", u.name);
        }
        assert!(size_pattern().contains("KiB"));
        assert!(duration_pattern().contains("ms"));
    }
}
