//! The agent's HTTP endpoints: `/metrics` (Prometheus text format), `/status` (JSON: the
//! agent's status plus live per-class and per-level counters) and `/healthz`.

use std::{net::SocketAddr, sync::Arc};

use anyhow::{Context as _, Result};
use axum::{
    Router,
    extract::State,
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};
use serde::Serialize;

use crate::agent::Shared;

/// Binds `addr` (so a port clash fails the start, not later) and serves until `shutdown`.
pub async fn serve(
    addr: SocketAddr,
    shared: Arc<Shared>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<tokio::task::JoinHandle<()>> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding the metrics address {addr} (--metrics-addr)"))?;
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/status", get(status))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/policy", get(policy_text))
        .with_state(shared);
    Ok(tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(shutdown).await {
            log::error!("HTTP server stopped: {e}");
        }
    }))
}

/// `/policy`: the text of the policy in force (`paceline policy diff --running`).
async fn policy_text(State(shared): State<Arc<Shared>>) -> Response {
    ([(header::CONTENT_TYPE, "application/yaml")], shared.policy_text()).into_response()
}

fn internal(e: anyhow::Error) -> Response {
    (StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}\n")).into_response()
}

async fn metrics(State(shared): State<Arc<Shared>>) -> Response {
    match shared.metrics() {
        Ok(text) => ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response(),
        Err(e) => internal(e),
    }
}

/// `/status`: the status document with live counters per class and level.
#[derive(Serialize)]
pub struct LiveStatus {
    #[serde(flatten)]
    pub status: crate::status::Status,
    pub counters: Counters,
}

#[derive(Serialize)]
pub struct Counters {
    pub classes: Vec<Named>,
    pub levels: Vec<Named>,
    pub unparsed: Unparsed,
    /// D3 counters of the classes that speak D3.
    pub d3_classes: Vec<D3Named>,
    /// C, N, D, A and counters of the D3 router links.
    pub d3_router_links: Vec<crate::d3router::LinkReport>,
}

#[derive(Serialize)]
pub struct D3Named {
    pub name: String,
    #[serde(flatten)]
    pub counters: D3Json,
}

#[derive(Serialize)]
pub struct D3Json {
    pub flows: u64,
    pub deadline_flows: u64,
    pub deadlines_met: u64,
    pub deadlines_missed: u64,
    pub quenched: u64,
    pub requests: u64,
    pub grants: u64,
    pub echoes: u64,
    pub feedback_ignored: u64,
    pub options_seen: u64,
}

impl From<&paceline_common::maps::D3ClassStats> for D3Json {
    fn from(c: &paceline_common::maps::D3ClassStats) -> Self {
        D3Json {
            flows: c.flows,
            deadline_flows: c.deadline_flows,
            deadlines_met: c.met,
            deadlines_missed: c.missed,
            quenched: c.quenched,
            requests: c.requests,
            grants: c.grants,
            echoes: c.echoes,
            feedback_ignored: c.feedback_ignored,
            options_seen: c.options_seen,
        }
    }
}

#[derive(Serialize)]
pub struct Named {
    pub name: String,
    #[serde(flatten)]
    pub counters: CountersJson,
}

#[derive(Serialize)]
pub struct CountersJson {
    pub packets: u64,
    pub bytes: u64,
    pub delayed_packets: u64,
    pub added_delay_seconds: f64,
    pub dropped_horizon: u64,
    pub tagged_packets: u64,
    pub tcp_sockets_configured: u64,
    pub tcp_sockopt_errors: u64,
}

impl From<&paceline_common::maps::Counters> for CountersJson {
    fn from(c: &paceline_common::maps::Counters) -> Self {
        CountersJson {
            packets: c.packets,
            bytes: c.bytes,
            delayed_packets: c.delayed_packets,
            added_delay_seconds: c.delay_ns as f64 * 1e-9,
            dropped_horizon: c.drops_horizon,
            tagged_packets: c.tagged_packets,
            tcp_sockets_configured: c.tcp_sockets,
            tcp_sockopt_errors: c.sockopt_errors,
        }
    }
}

#[derive(Serialize)]
pub struct Unparsed {
    pub non_ip: u64,
    pub truncated: u64,
    pub ipv6_extension_limit: u64,
}

async fn status(State(shared): State<Arc<Shared>>) -> Response {
    match shared.live_status() {
        Ok(s) => axum::Json(s).into_response(),
        Err(e) => internal(e),
    }
}
