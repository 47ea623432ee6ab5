//! Facts about the host that validation and compilation need, behind a trait so that both run
//! without a kernel: the agent's `SystemHost` (crate `paceline`) asks this machine, in the
//! caller's network namespace; [`OfflineHost`] assumes nothing (`paceline policy check
//! --offline`, CI); [`FakeHost`] is whatever a test says.

use std::collections::HashMap;

/// What validation asks about the host.
pub trait HostFacts {
    /// Does an interface of this name exist (in our network namespace)?
    fn interface_exists(&self, name: &str) -> bool;
    /// The interfaces that carry a default route, IPv4 then IPv6, without duplicates.
    fn default_route_interfaces(&self) -> Vec<String>;
    /// The interfaces any usable route (IPv4 or IPv6) leaves through, `lo` excluded: where
    /// this host's traffic can go. `None` when that is not known.
    fn route_interfaces(&self) -> Option<Vec<String>>;
    /// The interface's link rate in bytes/s; `None` when unknown (veth, some virtual NICs).
    fn link_rate(&self, iface: &str) -> Option<u64>;
    /// The id (inode number) of the cgroup v2 directory `path`, relative to the cgroup2 mount;
    /// `Err` says why not (e.g. "no such cgroup under /sys/fs/cgroup/unified").
    fn cgroup_id(&self, path: &str) -> Result<u64, String>;
    /// True for a host that knows nothing ([`OfflineHost`]): validation then turns the facts
    /// it cannot check into warnings instead of errors.
    fn is_offline(&self) -> bool {
        false
    }
}

/// Knows nothing: every interface exists, there are no default routes, no known routes and no
/// link rates, and cgroups are not resolved (validation compiles cgroup rules with id 0 and
/// warns).
#[derive(Clone, Copy, Debug, Default)]
pub struct OfflineHost;

impl HostFacts for OfflineHost {
    fn interface_exists(&self, _: &str) -> bool {
        true
    }
    fn default_route_interfaces(&self) -> Vec<String> {
        Vec::new()
    }
    fn route_interfaces(&self) -> Option<Vec<String>> {
        None
    }
    fn link_rate(&self, _: &str) -> Option<u64> {
        None
    }
    fn cgroup_id(&self, _: &str) -> Result<u64, String> {
        Err("cgroups are not resolved offline".into())
    }
    fn is_offline(&self) -> bool {
        true
    }
}

/// A host described by a test.
#[derive(Clone, Debug, Default)]
pub struct FakeHost {
    pub interfaces: Vec<String>,
    pub default_routes: Vec<String>,
    /// Interfaces of the other routes (the default routes' count as routes too).
    pub routes: Vec<String>,
    /// Bytes/s by interface; absent = unknown.
    pub link_rates: HashMap<String, u64>,
    /// Ids by path (without the leading `/`).
    pub cgroups: HashMap<String, u64>,
}

impl FakeHost {
    pub fn new() -> Self {
        Self::default()
    }
    /// Adds an interface with an optional link rate in bytes/s.
    pub fn with_interface(mut self, name: &str, rate: Option<u64>) -> Self {
        self.interfaces.push(name.to_string());
        if let Some(r) = rate {
            self.link_rates.insert(name.to_string(), r);
        }
        self
    }
    pub fn with_default_route(mut self, name: &str) -> Self {
        self.default_routes.push(name.to_string());
        self
    }
    /// A route that is not a default route, through `name`.
    pub fn with_route(mut self, name: &str) -> Self {
        self.routes.push(name.to_string());
        self
    }
    pub fn with_cgroup(mut self, path: &str, id: u64) -> Self {
        self.cgroups.insert(path.trim_start_matches('/').to_string(), id);
        self
    }
}

impl HostFacts for FakeHost {
    fn interface_exists(&self, name: &str) -> bool {
        self.interfaces.iter().any(|i| i == name)
    }
    fn default_route_interfaces(&self) -> Vec<String> {
        self.default_routes.clone()
    }
    fn route_interfaces(&self) -> Option<Vec<String>> {
        Some(dedup(
            self.default_routes.iter().chain(&self.routes).cloned().collect(),
        ))
    }
    fn link_rate(&self, iface: &str) -> Option<u64> {
        self.link_rates.get(iface).copied()
    }
    fn cgroup_id(&self, path: &str) -> Result<u64, String> {
        self.cgroups
            .get(path.trim_start_matches('/'))
            .copied()
            .ok_or_else(|| "no such cgroup under /sys/fs/cgroup/unified".to_string())
    }
}

/// The longest cgroup path accepted, in bytes: `PATH_MAX` (4096) less room for the mount
/// point it is joined to (`/sys/fs/cgroup/unified/`).
pub const MAX_CGROUP_PATH: usize = 4000;

/// Checks a cgroup path as written in a policy without the host: a plain path below the
/// cgroup2 mount (no `..` or `.`, no NUL byte) of at most [`MAX_CGROUP_PATH`] bytes. The agent
/// resolves only paths that pass (`SystemHost::cgroup_id`), and `policy check --offline`
/// refuses what fails, so both refuse the same paths.
pub fn check_cgroup_path(path: &str) -> Result<(), String> {
    if path.len() > MAX_CGROUP_PATH {
        return Err(format!(
            "is {} bytes long; a cgroup path may be at most {MAX_CGROUP_PATH} bytes",
            path.len()
        ));
    }
    if path.contains('\0') {
        return Err("contains a NUL byte; write a path below the cgroup2 mount".into());
    }
    if path.split('/').any(|c| c == ".." || c == ".") {
        return Err(
            "must be a plain path below the cgroup2 mount (no \"..\" or \".\" components), e.g. \"/system.slice/memcached.service\""
                .into(),
        );
    }
    Ok(())
}

/// True when every interface `host` has a route through is one of `managed` (the policy's
/// interfaces): only then may sock_ops mark sockets, whose traffic could otherwise leave marked
/// through an interface the policy does not cover (`CompileContext::all_routes_managed`).
/// False when the routes are not known (offline). The agent and `paceline policy check|diff`
/// all decide through this.
pub fn all_routes_managed(host: &dyn HostFacts, managed: &[String]) -> bool {
    match host.route_interfaces() {
        Some(routes) => routes.iter().all(|i| managed.contains(i)),
        None => false,
    }
}

/// `v` without repeated names, in first-seen order.
pub fn dedup(v: Vec<String>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for s in v {
        if !out.contains(&s) {
            out.push(s);
        }
    }
    out
}
