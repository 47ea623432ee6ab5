//! How rates are enforced: what a policy asks for ([`EnforcementRequest`], `spec.enforcement`),
//! what the agent uses on this kernel ([`EnforcementMode`]), and the choice between them
//! ([`decide_mode`]).

use anyhow::{Result, bail};

use super::raw;
use crate::features::Features;

/// `spec.enforcement`: what the policy asks the agent to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EnforcementRequest {
    /// The best the kernel offers (the agent decides).
    Auto,
    Fq,
    Htb,
    Sockops,
    None,
}

impl EnforcementRequest {
    pub fn as_str(self) -> &'static str {
        match self {
            EnforcementRequest::Auto => "auto",
            EnforcementRequest::Fq => "fq",
            EnforcementRequest::Htb => "htb",
            EnforcementRequest::Sockops => "sockops",
            EnforcementRequest::None => "none",
        }
    }

    /// The mode the policy insists on; `None` for `auto` (the agent picks).
    pub fn fixed(self) -> Option<EnforcementMode> {
        match self {
            EnforcementRequest::Auto => None,
            EnforcementRequest::Fq => Some(EnforcementMode::Fq),
            EnforcementRequest::Htb => Some(EnforcementMode::Htb),
            EnforcementRequest::Sockops => Some(EnforcementMode::SockopsOnly),
            EnforcementRequest::None => Some(EnforcementMode::None),
        }
    }
}

impl From<raw::Enforcement> for EnforcementRequest {
    fn from(e: raw::Enforcement) -> Self {
        match e {
            raw::Enforcement::Auto => EnforcementRequest::Auto,
            raw::Enforcement::Fq => EnforcementRequest::Fq,
            raw::Enforcement::Htb => EnforcementRequest::Htb,
            raw::Enforcement::Sockops => EnforcementRequest::Sockops,
            raw::Enforcement::None => EnforcementRequest::None,
        }
    }
}

/// How the agent enforces rates on this host (decided from `spec.enforcement` and the kernel).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EnforcementMode {
    /// EDT timestamps held by `fq`.
    Fq,
    /// An HTB hierarchy for the aggregates (see [`HtbPlan`](super::HtbPlan)).
    Htb,
    /// Only sock_ops' per-socket settings.
    SockopsOnly,
    /// Classify, tag and count only.
    None,
}

impl EnforcementMode {
    pub fn as_str(self) -> &'static str {
        match self {
            EnforcementMode::Fq => "fq",
            EnforcementMode::Htb => "htb",
            EnforcementMode::SockopsOnly => "sockops",
            EnforcementMode::None => "none",
        }
    }
}

/// Picks how the policy is enforced on this kernel: `auto` takes the best mode the kernel
/// offers (fq, then htb, then sockops, then none); a fixed request the kernel cannot give is
/// an error saying why.
pub fn decide_mode(req: EnforcementRequest, f: &Features) -> Result<EnforcementMode> {
    let sockops = f.cgroup2.is_some();
    Ok(match req {
        EnforcementRequest::Auto if f.sch_fq => EnforcementMode::Fq,
        EnforcementRequest::Auto if f.sch_htb => EnforcementMode::Htb,
        EnforcementRequest::Auto if sockops => EnforcementMode::SockopsOnly,
        EnforcementRequest::Auto => EnforcementMode::None,
        EnforcementRequest::Fq if !f.sch_fq => bail!(
            "the policy asks for `enforcement: fq` but this kernel has no sch_fq (kernel {}); \
             use `auto` to fall back to HTB and TCP pacing",
            f.kernel_release
        ),
        EnforcementRequest::Fq => EnforcementMode::Fq,
        EnforcementRequest::Htb if !f.sch_htb => {
            bail!("the policy asks for `enforcement: htb` but this kernel has no sch_htb")
        }
        EnforcementRequest::Htb => EnforcementMode::Htb,
        EnforcementRequest::Sockops if !sockops => {
            bail!("the policy asks for `enforcement: sockops` but no cgroup v2 is mounted")
        }
        EnforcementRequest::Sockops => EnforcementMode::SockopsOnly,
        EnforcementRequest::None => EnforcementMode::None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kernel(fq: bool, htb: bool, cgroup2: bool) -> Features {
        Features {
            kernel_release: "6.1.0-test".into(),
            btf: true,
            tcx: false,
            sch_fq: fq,
            sch_htb: htb,
            clsact: true,
            cgroup2: cgroup2.then(|| "/sys/fs/cgroup".into()),
            bpffs: None,
        }
    }

    #[test]
    fn auto_takes_the_best_the_kernel_offers() {
        let auto = |f: &Features| decide_mode(EnforcementRequest::Auto, f).unwrap();
        assert_eq!(auto(&kernel(true, true, true)), EnforcementMode::Fq);
        assert_eq!(auto(&kernel(false, true, true)), EnforcementMode::Htb);
        assert_eq!(auto(&kernel(false, false, true)), EnforcementMode::SockopsOnly);
        assert_eq!(auto(&kernel(false, false, false)), EnforcementMode::None);
    }

    #[test]
    fn a_fixed_request_the_kernel_cannot_give_is_refused() {
        let bare = kernel(false, false, false);
        let e = decide_mode(EnforcementRequest::Fq, &bare)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no sch_fq (kernel 6.1.0-test)"), "{e}");
        assert!(decide_mode(EnforcementRequest::Htb, &bare).is_err());
        assert!(decide_mode(EnforcementRequest::Sockops, &bare).is_err());
        assert_eq!(
            decide_mode(EnforcementRequest::None, &bare).unwrap(),
            EnforcementMode::None
        );
        for req in [
            EnforcementRequest::Fq,
            EnforcementRequest::Htb,
            EnforcementRequest::Sockops,
            EnforcementRequest::None,
        ] {
            assert_eq!(
                decide_mode(req, &kernel(true, true, true)).ok(),
                req.fixed(),
                "{req:?}"
            );
        }
    }
}
