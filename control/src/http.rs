//! The agent's HTTP endpoints: `/metrics` (Prometheus text format), `/status` (JSON: the
//! agent's status plus live per-class and per-level counters) and `/healthz`.

use std::{net::SocketAddr, sync::Arc};

use crate::shared::Shared;
use anyhow::{Context as _, Result};
use axum::{
    Router,
    extract::State,
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};

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
async fn status(State(shared): State<Arc<Shared>>) -> Response {
    match shared.live_status() {
        Ok(s) => axum::Json(s).into_response(),
        Err(e) => internal(e),
    }
}
