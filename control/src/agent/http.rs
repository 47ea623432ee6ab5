//! The agent's HTTP endpoints, on two listeners:
//!
//! - `--metrics-addr` (what Prometheus scrapes, often on the node's network): `/metrics`
//!   (Prometheus text format), `/healthz` (liveness) and `/readyz` (readiness);
//! - `--api-addr` (loopback by default: it reveals the policy and the flows and changes state):
//!   `/status` (JSON: the status plus live counters), `/policy` (the text in force), `/events`
//!   (JSON lines, `?since=SEQ&limit=N`), `/flows` (`?top=N&class=C`), `/trace` (a stream of
//!   JSON lines, one per traced packet: `?count=&seconds=&class=&proto=&src=&dst=&drops=1&sample=&per_sec=`,
//!   [`crate::runtime::trace`]), `/classify`
//!   (`?proto=tcp&src=A:P&dst=B:P[&dscp=&mark=&cgroup_id=]`), `/history`, `/history/GEN`,
//!   `POST /reload` (apply the file now, answer with the outcome), `POST /rollback[?generation=N]`,
//!   `POST /alertmanager` (Alertmanager's webhook: alerts that roll this host back,
//!   [`crate::runtime::alerts`]),
//!   and `/healthz`, `/readyz` again.
//!
//! When both addresses are the same, one listener serves everything. With a token file
//! ([`crate::runtime::auth`]) every API route but `/healthz` and `/readyz` asks for the bearer token:
//! 401 without it or with another (counted in `paceline_api_requests_refused_total`), 503 when
//! the file cannot be read.
//! Unhealthy or not ready: HTTP 503 with the JSON reasons ([`crate::runtime::health`]).

use std::{collections::HashMap, net::SocketAddr, sync::Arc};

use crate::host::SystemHost;
use crate::{classify, runtime::shared::Shared};
use anyhow::{Context as _, Result};
use axum::{
    Router,
    extract::{Path, Query, Request, State},
    http::{StatusCode, header},
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::{get, post},
};

use crate::runtime::auth::{ApiAuth, Refusal};

type Params = Query<HashMap<String, String>>;

/// Binds both addresses (so a port clash fails the start, not later) and serves until `stop`
/// turns true.
pub async fn serve(
    metrics_addr: SocketAddr,
    api_addr: SocketAddr,
    auth: Option<Arc<ApiAuth>>,
    shared: Arc<Shared>,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Result<Vec<tokio::task::JoinHandle<()>>> {
    if let Some(a) = &auth {
        shared.set_api_auth(a.clone());
    }
    let probes = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz));
    let metrics = Router::new().route("/metrics", get(metrics));
    let mut api = Router::new()
        .route("/status", get(status))
        .route("/policy", get(policy_text))
        .route("/events", get(events))
        .route("/flows", get(flows))
        .route("/trace", get(trace))
        .route("/classify", get(classify_q))
        .route("/history", get(history))
        .route("/history/{generation}", get(history_text))
        .route("/reload", post(reload))
        .route("/rollback", post(rollback))
        .route("/alertmanager", post(alertmanager));
    if let Some(a) = auth {
        api = api.route_layer(middleware::from_fn_with_state(a, require_token));
    }
    let mut plans = Vec::new();
    if metrics_addr == api_addr {
        plans.push((
            metrics_addr,
            "--metrics-addr and --api-addr",
            metrics.merge(api).merge(probes),
        ));
    } else {
        plans.push((metrics_addr, "--metrics-addr", metrics.merge(probes.clone())));
        plans.push((api_addr, "--api-addr", api.merge(probes)));
    }
    let mut listeners = Vec::new();
    for (addr, flag, app) in plans {
        let l = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding {addr} ({flag})"))?;
        listeners.push((l, app.with_state(shared.clone())));
    }
    Ok(listeners
        .into_iter()
        .map(|(l, app)| {
            let mut stop = stop.clone();
            tokio::spawn(async move {
                let shutdown = async move {
                    let _ = stop.wait_for(|s| *s).await;
                };
                if let Err(e) = axum::serve(l, app).with_graceful_shutdown(shutdown).await {
                    log::error!("HTTP server stopped: {e}");
                }
            })
        })
        .collect())
}

/// Lets a request through only with the token file's bearer token.
async fn require_token(State(auth): State<Arc<ApiAuth>>, req: Request, next: Next) -> Response {
    let header = req
        .headers()
        .get(header::AUTHORIZATION)
        .map(|v| v.as_bytes().to_vec());
    let a = auth.clone();
    let verdict = blocking(move || a.check(header.as_deref())).await.and_then(|r| r);
    match verdict {
        Ok(Ok(())) => next.run(req).await,
        Ok(Err(why)) => {
            let what = match why {
                Refusal::Missing => "this API asks for a bearer token (Authorization: Bearer ...)",
                Refusal::Wrong => "the bearer token is not the agent's",
            };
            (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Bearer realm=\"paceline\"")],
                format!("{what}; the commands send the token from PACELINE_API_TOKEN_FILE\n"),
            )
                .into_response()
        }
        Err(e) => {
            log::error!("refusing an API request: {e:#}");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "the agent cannot read its API token file ({}): refusing every request\n",
                    auth.path().display()
                ),
            )
                .into_response()
        }
    }
}

fn internal(e: anyhow::Error) -> Response {
    (StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}\n")).into_response()
}

fn bad_request(e: impl std::fmt::Display) -> Response {
    (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response()
}

/// Runs `f` off the async workers (it takes the shared lock and may do many syscalls).
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f).await.context("request task")
}

/// `/trace`: starts a trace session and streams its lines until it ends (409 while another
/// runs, 400 for a bad query).
async fn trace(State(shared): State<Arc<Shared>>, Query(q): Params) -> Response {
    use crate::runtime::trace::{self, StartError};
    let req = match trace::Request::from_query(&q) {
        Ok(r) => r,
        Err(e) => return bad_request(format!("{e:#}")),
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<String>(4096);
    let started = blocking(move || trace::start(shared, req, tx)).await;
    match started {
        Ok(Ok(())) => {}
        Ok(Err(StartError::Busy)) => {
            return (
                StatusCode::CONFLICT,
                "a trace is already running; one at a time\n",
            )
                .into_response();
        }
        Ok(Err(StartError::Bad(e))) => return bad_request(e),
        Ok(Err(StartError::Failed(e))) | Err(e) => return internal(e),
    }
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|l| (Ok::<_, std::convert::Infallible>(l), rx))
    });
    (
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        axum::body::Body::from_stream(stream),
    )
        .into_response()
}

/// `/policy`: the text of the policy in force (`paceline policy diff --running`).
async fn policy_text(State(shared): State<Arc<Shared>>) -> Response {
    ([(header::CONTENT_TYPE, "application/yaml")], shared.policy_text()).into_response()
}

async fn metrics(State(shared): State<Arc<Shared>>) -> Response {
    match blocking(move || shared.metrics()).await.and_then(|r| r) {
        Ok(text) => ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response(),
        Err(e) => internal(e),
    }
}

async fn health(shared: Arc<Shared>, readiness: bool) -> Response {
    match blocking(move || shared.health(readiness)).await {
        Ok(h) => {
            let code = if h.healthy() {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            (code, axum::Json(h)).into_response()
        }
        Err(e) => internal(e),
    }
}

async fn healthz(State(shared): State<Arc<Shared>>) -> Response {
    health(shared, false).await
}

async fn readyz(State(shared): State<Arc<Shared>>) -> Response {
    health(shared, true).await
}

/// `/status`: the status document with live counters.
async fn status(State(shared): State<Arc<Shared>>) -> Response {
    match blocking(move || shared.live_status()).await.and_then(|r| r) {
        Ok(s) => axum::Json(s).into_response(),
        Err(e) => internal(e),
    }
}

fn num<T: std::str::FromStr>(q: &HashMap<String, String>, k: &str) -> Result<Option<T>, String> {
    match q.get(k) {
        None => Ok(None),
        Some(v) => v
            .parse()
            .map(Some)
            .map_err(|_| format!("{k}={v:?} is not a number")),
    }
}

/// `/events?since=SEQ&limit=N`: JSON lines, oldest first.
async fn events(State(shared): State<Arc<Shared>>, Query(q): Params) -> Response {
    let since = match num::<u64>(&q, "since") {
        Ok(v) => v.unwrap_or(0),
        Err(e) => return bad_request(e),
    };
    let limit = match num::<usize>(&q, "limit") {
        Ok(v) => v.unwrap_or(crate::runtime::events::MEMORY),
        Err(e) => return bad_request(e),
    };
    let body = crate::runtime::events::to_json_lines(&shared.events.since(since, limit));
    ([(header::CONTENT_TYPE, "application/jsonl")], body).into_response()
}

/// `/flows?top=N&class=C`.
async fn flows(State(shared): State<Arc<Shared>>, Query(q): Params) -> Response {
    let top = match num::<usize>(&q, "top") {
        Ok(v) => v.unwrap_or(50),
        Err(e) => return bad_request(e),
    };
    let class = q.get("class").cloned();
    match blocking(move || shared.flows(top, class.as_deref()))
        .await
        .and_then(|r| r)
    {
        Ok(f) => axum::Json(f).into_response(),
        Err(e) => internal(e),
    }
}

/// `/classify?proto=tcp&src=A[:P]&dst=B[:P]&dscp=&mark=&cgroup_id=`.
async fn classify_q(State(shared): State<Arc<Shared>>, Query(q): Params) -> Response {
    let get = |k: &str| q.get(k).cloned().unwrap_or_default();
    let query = classify::Query {
        proto: get("proto"),
        src: get("src"),
        dst: get("dst"),
        dscp: match num(&q, "dscp") {
            Ok(v) => v,
            Err(e) => return bad_request(e),
        },
        mark: match num(&q, "mark") {
            Ok(v) => v,
            Err(e) => return bad_request(e),
        },
        cgroup_id: match num(&q, "cgroup_id") {
            Ok(v) => v,
            Err(e) => return bad_request(e),
        },
    };
    let answer = classify::explain(&shared.lock().compiled, &query);
    match answer {
        Ok(a) => axum::Json(a).into_response(),
        Err(e) => bad_request(format!("{e:#}")),
    }
}

/// `/history`: the entries, oldest first, and the hash in force.
async fn history(State(shared): State<Arc<Shared>>) -> Response {
    let current = shared.lock().compiled.hash.clone();
    axum::Json(serde_json::json!({
        "current_hash": current,
        "entries": shared.history.entries(),
    }))
    .into_response()
}

/// `/history/GEN`: that entry's policy text.
async fn history_text(State(shared): State<Arc<Shared>>, Path(generation): Path<u64>) -> Response {
    match shared.history.get(generation) {
        Ok((_, text)) => ([(header::CONTENT_TYPE, "application/yaml")], text).into_response(),
        Err(e) => (StatusCode::NOT_FOUND, format!("{e:#}\n")).into_response(),
    }
}

/// `POST /alertmanager`: Alertmanager's webhook; a firing alert about this host with
/// `paceline_action: rollback` rolls it back ([`crate::runtime::alerts`]). Answers with what it
/// did per alert.
async fn alertmanager(State(shared): State<Arc<Shared>>, body: axum::body::Bytes) -> Response {
    use crate::runtime::alerts::{Answer, Decision, Handled, Local, Message};
    let msg: Message = match serde_json::from_slice(&body) {
        Ok(m) => m,
        Err(e) => return bad_request(format!("not an Alertmanager webhook message: {e}")),
    };
    let done = blocking(move || {
        let local = Local::probe();
        let mut answer = Answer::default();
        for a in &msg.alerts {
            let instance = a.labels.get("instance").cloned().unwrap_or_default();
            let outcome = match shared.alerts.decide(a, &local) {
                Decision::Ignore => {
                    answer.ignored += 1;
                    continue;
                }
                Decision::AlreadyHandled => "already handled".to_string(),
                Decision::Rollback => {
                    let cause = format!("alert {}", a.name());
                    match super::reload::rollback_for(&shared, &SystemHost::new(), None, Some(&cause)) {
                        super::reload::Outcome::Rejected { errors } => {
                            format!("rollback rejected: {}", errors.join("; "))
                        }
                        _ => "rolled back".to_string(),
                    }
                }
            };
            answer.handled.push(Handled {
                alert: a.name().to_string(),
                instance,
                outcome,
            });
        }
        answer
    })
    .await;
    match done {
        Ok(a) => axum::Json(a).into_response(),
        Err(e) => internal(e),
    }
}

fn outcome_response(o: super::reload::Outcome) -> Response {
    let code = if o.ok() {
        StatusCode::OK
    } else {
        StatusCode::UNPROCESSABLE_ENTITY
    };
    (code, axum::Json(o)).into_response()
}

/// `POST /reload`: applies the policy file now (`systemctl reload`), answering with what
/// happened: applied (with the changes), unchanged, or rejected (with the errors).
async fn reload(State(shared): State<Arc<Shared>>) -> Response {
    match blocking(move || {
        let _ = sd_notify::notify(&[sd_notify::NotifyState::Reloading]);
        let o = super::reload::reload(&shared, &SystemHost::new(), "reload request", true, None);
        super::watch::notify_ready(&shared);
        o
    })
    .await
    {
        Ok(o) => outcome_response(o),
        Err(e) => internal(e),
    }
}

/// `POST /rollback[?generation=N]`.
async fn rollback(State(shared): State<Arc<Shared>>, Query(q): Params) -> Response {
    let generation = match num::<u64>(&q, "generation") {
        Ok(v) => v,
        Err(e) => return bad_request(e),
    };
    match blocking(move || super::reload::rollback(&shared, &SystemHost::new(), generation)).await {
        Ok(o) => outcome_response(o),
        Err(e) => internal(e),
    }
}
