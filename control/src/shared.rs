//! What the agent's event loop, its reloads and the HTTP handlers share: the loaded datapath,
//! the D3 router, the compiled policy in force and its text, and the status. One lock guards
//! them all (a scrape, a reload and a controller tick never interleave).

use std::sync::{Mutex, MutexGuard};

use anyhow::{Result, anyhow};

use crate::{
    d3router::Router,
    datapath::Datapath,
    metrics,
    policy::Compiled,
    status::{LiveStatus, Status},
};

pub struct Shared {
    inner: Mutex<Inner>,
}

/// The shared state, behind [`Shared::lock`].
pub struct Inner {
    /// The text of the policy in force (served at `/policy`, for `paceline policy diff`).
    pub policy_text: String,
    /// `None` once shutdown has detached the programs.
    pub dp: Option<Datapath>,
    pub router: Option<Router>,
    pub status: Status,
    /// The policy in force, compiled for the running mode and interfaces.
    pub compiled: Compiled,
}

impl Shared {
    pub fn new(inner: Inner) -> Shared {
        Shared {
            inner: Mutex::new(inner),
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves data that is still consistent enough to read.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `/metrics`: the Prometheus text of the counters, labelled by the status.
    pub fn metrics(&self) -> Result<String> {
        let g = self.lock();
        let dp = g.dp()?;
        let d3 = if g.status.d3.is_some() {
            Some(dp.d3_snapshot()?)
        } else {
            None
        };
        let links = g.router.as_ref().map(|r| r.report(dp)).unwrap_or_default();
        let mut text = metrics::render(&dp.snapshot()?, d3.as_deref(), &links, &g.status)?;
        if g.status.dasr.is_some() {
            text.push_str(&crate::dasr::metrics(&crate::dasr::report(dp)?)?);
        }
        Ok(text)
    }

    /// The text of the policy in force.
    pub fn policy_text(&self) -> String {
        self.lock().policy_text.clone()
    }

    /// One tick of the D3 router's capacity controller.
    pub fn d3_tick(&self) -> Result<()> {
        let mut g = self.lock();
        let Inner { dp, router, .. } = &mut *g;
        if let (Some(dp), Some(router)) = (dp.as_mut(), router.as_mut()) {
            router.tick(dp)?;
        }
        Ok(())
    }

    /// `/status`: the status with live counters.
    pub fn live_status(&self) -> Result<LiveStatus> {
        let g = self.lock();
        let dp = g.dp()?;
        let snap = dp.snapshot()?;
        let d3 = if g.status.d3.is_some() {
            Some(dp.d3_snapshot()?)
        } else {
            None
        };
        let links = g.router.as_ref().map(|r| r.report(dp)).unwrap_or_default();
        let dasr = match g.status.dasr {
            Some(_) => Some(crate::dasr::report(dp)?),
            None => None,
        };
        Ok(LiveStatus::new(g.status.clone(), &snap, d3.as_deref(), &links).with_dasr(dasr.as_ref()))
    }
}

impl Inner {
    pub fn dp(&self) -> Result<&Datapath> {
        self.dp
            .as_ref()
            .ok_or_else(|| anyhow!("the agent is shutting down"))
    }

    pub fn dp_mut(&mut self) -> Result<&mut Datapath> {
        self.dp
            .as_mut()
            .ok_or_else(|| anyhow!("the agent is shutting down"))
    }
}
