//! What tests of the policy pipeline share, here and in the crates that use it: the host the
//! invalid fixtures are written for, and parsing that must succeed or must fail.

use crate::{FakeHost, HostFacts, Validated, parse_str};

/// The host the fixtures (`policy/tests/fixtures/invalid`) are written for: eth0 (10 Gbit/s,
/// default route), eth1 (speed unknown), one resolvable cgroup.
pub fn fake_host() -> FakeHost {
    FakeHost::new()
        .with_interface("eth0", Some(1_250_000_000))
        .with_interface("eth1", None)
        .with_default_route("eth0")
        .with_cgroup("/system.slice/memcached.service", 4242)
}

/// `text` validated against `host`; panics with every error when it does not validate.
pub fn ok(text: &str, host: &dyn HostFacts) -> Validated {
    match parse_str(text, "test.yaml", host) {
        Ok(v) => v,
        Err(es) => panic!(
            "policy rejected:\n{}",
            es.iter().map(|e| format!("  {e}\n")).collect::<String>()
        ),
    }
}

/// The errors `text` produces against `host`, as printed; panics when it validates.
pub fn errors(text: &str, host: &dyn HostFacts) -> Vec<String> {
    match parse_str(text, "test.yaml", host) {
        Ok(_) => panic!("policy accepted, expected errors"),
        Err(es) => es.iter().map(|e| e.to_string()).collect(),
    }
}
